//! Helpers shared by the cross-process tests: locating binaries and tools, spawning and stopping processes.
