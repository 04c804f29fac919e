"""Training: algorithm implementations (torch) and the loop that runs one seed."""
