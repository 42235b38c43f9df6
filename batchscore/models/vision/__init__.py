"""Image and text towers of one space (CLIP, SigLIP): which folder holds them, and images as
their processor makes them."""
