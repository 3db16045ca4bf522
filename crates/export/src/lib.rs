//! Exports that serve a block device to real clients.
