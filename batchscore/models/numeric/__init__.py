"""The tensor task's parts: numeric feature columns as one float32 matrix, the model file told
apart by content and loaded without running pickles, and the factories safetensors weights fill."""
