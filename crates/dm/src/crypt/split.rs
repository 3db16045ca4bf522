//! Splitting one large request's crypto across cores.

use std::io;

use cryptblk_cipher::CipherError;

use super::cipher_io;
use crate::SECTOR_SIZE;

/// When an inline request's crypto is divided among several threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SplitPolicy {
    /// Always on the calling thread.
    #[default]
    Off,
    /// Requests of at least this many bytes are cut into one piece per CPU; the caller
    /// does one piece, scoped helper threads the others.
    Above(usize),
}

impl SplitPolicy {
    /// Short description for status output.
    pub fn describe(&self) -> String {
        match self {
            SplitPolicy::Off => "off".into(),
            SplitPolicy::Above(n) => format!(">={n}"),
        }
    }

    /// Runs `op(sector, piece)` over `buf` (starting at 512-byte `sector`), split per policy.
    pub(crate) fn run(
        &self,
        buf: &mut [u8],
        sector: u64,
        op: impl Fn(u64, &mut [u8]) -> Result<(), CipherError> + Sync,
    ) -> io::Result<()> {
        let threshold = match self {
            SplitPolicy::Above(n) if buf.len() >= *n => *n,
            _ => return op(sector, buf).map_err(cipher_io),
        };
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        // Pieces stay multiples of 4 KiB so they hold whole encryption sectors.
        let piece = (buf.len() / cpus)
            .next_multiple_of(4096)
            .max(threshold.min(4096));
        if cpus < 2 || piece >= buf.len() {
            return op(sector, buf).map_err(cipher_io);
        }
        let op = &op;
        std::thread::scope(|scope| {
            let mut chunks = buf.chunks_mut(piece).enumerate();
            let (_, first) = chunks.next().unwrap_or((0, &mut []));
            let helpers: Vec<_> = chunks
                .map(|(i, chunk)| {
                    let s = sector + (i * piece) as u64 / SECTOR_SIZE;
                    scope.spawn(move || op(s, chunk))
                })
                .collect();
            let mut result = op(sector, first);
            for h in helpers {
                let r = h.join().unwrap_or_else(|_| {
                    Err(CipherError::Backend("crypto helper thread panicked".into()))
                });
                if result.is_ok() {
                    result = r;
                }
            }
            result.map_err(cipher_io)
        })
    }
}
