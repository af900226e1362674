"""fleet: corpus to pre-training TFRecords on short-lived VMs coordinated through a bucket."""

__version__ = "0.1.0"
