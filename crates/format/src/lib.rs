//! On-disk volume formats: LUKS1, LUKS2 and plain dm-crypt.
