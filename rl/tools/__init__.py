"""Tools around a PPO run: the greedy accuracy of each checkpoint (`checkpoint_curve`) and a GGUF
checkpoint read into a transformers folder (`gguf_convert`)."""
