"""Where a model is: a path, a built-in, or a Hugging Face id in the local cache, found offline;
its folder checked and loaded through transformers without running code."""
