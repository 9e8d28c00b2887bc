"""In-process execution of converted DFlash drafters (torch, CPU or CUDA)."""
