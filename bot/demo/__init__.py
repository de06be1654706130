"""`make demo`: a real tiny PyTorch run that goes wrong, watched, alerted and rolled back, with no
Slack account."""
