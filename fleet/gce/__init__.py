"""The Compute Engine wing: config, instance templates and groups, IAM, pre-launch checks,
cost estimates, boot records. Only the CLI imports it."""
