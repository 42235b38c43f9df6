"""Text as models read it: the tokenizer, the token template, windows of long texts, sentences,
and the text inputs a task reads from a window."""
