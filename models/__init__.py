"""The demo model repository and the scripts that train and export its models (`make models`)."""
