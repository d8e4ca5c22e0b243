"""What a model is: its configuration, the families as data, the encoder and its heads, their
outputs and losses, pooling, and loading checkpoints into them."""
