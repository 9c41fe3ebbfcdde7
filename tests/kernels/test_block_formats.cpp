// placeholder: being written by the block-format test helper
