//! Is a volume bound to tang? Its unit must then wait for the network, as `_netdev` asks.
//!
//! The generator looks at the LUKS2 header when it can read it (the device is there, or
//! the header is a file): a clevis token whose JWE was made by the `tang` pin, or by an
//! `sss` pin with a tang share, needs the network to unlock. When the header cannot be read
//! at generation time (a device that appears later in boot), the line needs `_netdev`, as
//! clevis documents for crypttab.

use cryptblk_volume::luks::{LuksType, Volume};
use cryptblk_volume::token::clevis::Jwe;
use std::path::Path;

/// Whether the LUKS2 header at `header` (a device or a detached header file) has a clevis
/// token that needs a tang server. False when it cannot be read or is not LUKS2.
pub fn bound_to_tang(header: &Path) -> bool {
    let Ok(Volume::Luks2(h, _)) = Volume::load(header, LuksType::Luks2, false) else {
        return false;
    };
    h.token_ids()
        .into_iter()
        .filter_map(|id| h.token(id))
        .filter(|t| t["type"] == "clevis")
        .filter_map(|t| Jwe::from_token(t).ok())
        .any(|j| needs_network(&j, 0))
}

/// A tang JWE, or an sss one with a tang share (nested at most a few levels, as clevis
/// configurations are).
fn needs_network(j: &Jwe, depth: u32) -> bool {
    match j.pin() {
        "tang" => true,
        "sss" if depth < 8 => j.header["clevis"]["sss"]["jwe"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str())
            .filter_map(|c| Jwe::from_compact(c).ok())
            .any(|sub| needs_network(&sub, depth + 1)),
        _ => false,
    }
}
