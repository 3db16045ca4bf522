//! One NBD client connection: drives the handshake and then the transmission phase.

use std::io;

use super::handshake::{handshake, Negotiated};
use super::transmission::Transmission;
use super::wire::Stream;
use super::Shared;

/// Serves one client until it disconnects or the server stops, then closes the socket
/// (explicitly: the server keeps a clone of it for stopping, which would keep it open).
pub(crate) fn serve(stream: Stream, shared: &Shared) -> io::Result<()> {
    let control = stream.try_clone();
    let result = serve_inner(stream, shared);
    if let Ok(control) = control {
        control.shutdown_both();
    }
    result
}

fn serve_inner(mut stream: Stream, shared: &Shared) -> io::Result<()> {
    match handshake(&mut stream, shared)? {
        Negotiated::Close => Ok(()),
        Negotiated::Transmission {
            structured,
            strict,
            block_status,
        } => Transmission::new(stream, shared, structured, strict, block_status).run(),
    }
}
