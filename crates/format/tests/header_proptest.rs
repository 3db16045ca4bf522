//! Header parsers never panic, whatever the bytes.

use cryptblk_format::hdrio::MemIo;
use cryptblk_format::luks1::{Luks1Header, Luks1Volume, LUKS1_HEADER_SIZE};
use proptest::prelude::*;

/// A valid header (from a fixed template) to mutate, so mutations reach deep checks.
fn template() -> Vec<u8> {
    let mut b = vec![0u8; LUKS1_HEADER_SIZE];
    b[..6].copy_from_slice(b"LUKS\xba\xbe");
    b[7] = 1;
    b[8..11].copy_from_slice(b"aes");
    b[40..51].copy_from_slice(b"xts-plain64");
    b[72..78].copy_from_slice(b"sha256");
    b[104..108].copy_from_slice(&4096u32.to_be_bytes());
    b[108..112].copy_from_slice(&64u32.to_be_bytes());
    b[164..168].copy_from_slice(&1000u32.to_be_bytes());
    for i in 0..8 {
        let at = 208 + 48 * i;
        b[at..at + 4].copy_from_slice(&0xDEADu32.to_be_bytes());
        b[at + 40..at + 44].copy_from_slice(&(8 + 504 * i as u32).to_be_bytes());
        b[at + 44..at + 48].copy_from_slice(&4000u32.to_be_bytes());
    }
    b
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..1200)) {
        let _ = Luks1Header::parse(&bytes);
        let _ = Luks1Volume::open(MemIo::new(bytes));
    }

    #[test]
    fn mutated_headers_never_panic(
        edits in proptest::collection::vec((0usize..LUKS1_HEADER_SIZE, any::<u8>()), 1..24),
        extra in 0usize..(3 << 20),
    ) {
        let mut b = template();
        prop_assert!(Luks1Header::parse(&b).is_ok());
        for (at, v) in edits {
            b[at] = v;
        }
        if let Ok(h) = Luks1Header::parse(&b) {
            // Accepted headers re-serialise to something that parses identically.
            let again = Luks1Header::parse(&h.to_bytes().unwrap()).unwrap();
            prop_assert_eq!(again, h);
        }
        b.resize(LUKS1_HEADER_SIZE + extra, 0);
        let _ = Luks1Volume::open(MemIo::new(b));
    }
}
