"""Running what `lower` built: the kernel a session calls, `.so` artifact I/O and its ELF check,
the fork sandbox for builds that may crash, and onnxruntime-relative timing."""
