"""Jobs: one folder each, found by fleet.job.load_job."""
