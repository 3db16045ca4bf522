//! Feeds arbitrary bytes to the LUKS header parsers: they must reject garbage with an error,
//! never panic, loop or allocate without bound.
#![no_main]

use cryptblk_format::hdrio::MemIo;
use cryptblk_format::luks1::{Luks1Header, Luks1Volume};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = Luks1Header::parse(data) {
        // Whatever is accepted must serialise and re-parse to the same header.
        let bytes = h.to_bytes().expect("accepted header serialises");
        assert_eq!(Luks1Header::parse(&bytes).expect("re-parse"), h);
    }
    let dev = MemIo::new(data.to_vec());
    let _ = Luks1Volume::open(&dev);
    let _ = cryptblk_format::luks2::Luks2Header::read(&dev);
});
