"""One training step and its parts: the loop (train), the micro-batch schedule (pipeline), the loss reductions
(loss), the optimizer (optim), the LR schedule (schedule), evaluation (evaluate) and the FLOPs model (flops)."""
