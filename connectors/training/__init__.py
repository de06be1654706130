"""What runs inside training jobs: the HF and Lightning callbacks, RunLogger for hand-written
loops, the control-file protocol and the `runwatch launch` supervisor. These import torch; the
bot only writes control requests and reads what they log."""
