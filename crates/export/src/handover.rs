//! A listening socket inherited from a predecessor process (`cryptblk upgrade`): the
//! successor offers it here before starting its export, and the export adopts it instead of
//! binding, so clients connecting during the upgrade wait in the socket's backlog rather
//! than being refused.
//!
//! Invariant: one slot per process (a daemon serves one export); an offered socket is
//! adopted only by an export of the same kind (a Unix or TCP stream listener as its config
//! asks), else it stays here until [`discard`] and the export binds as usual.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Mutex;

static OFFERED: Mutex<Option<OwnedFd>> = Mutex::new(None);

/// Offers `listener` (inherited from the predecessor) to the next export that starts.
pub fn offer(listener: OwnedFd) {
    *OFFERED.lock().unwrap_or_else(|e| e.into_inner()) = Some(listener);
}

/// Closes an offered listener no export adopted.
pub fn discard() {
    OFFERED.lock().unwrap_or_else(|e| e.into_inner()).take();
}

/// The offered listener, if it is a listening stream socket of address family `family`
/// (`AF_UNIX`, `AF_INET`, `AF_INET6`); a socket of another kind stays offered.
pub(crate) fn adopt(family: &[libc::c_int]) -> Option<OwnedFd> {
    let mut slot = OFFERED.lock().unwrap_or_else(|e| e.into_inner());
    let fd = slot.as_ref()?;
    let domain = sockopt(fd, libc::SO_DOMAIN)?;
    let listening = sockopt(fd, libc::SO_ACCEPTCONN)? != 0;
    let stream = sockopt(fd, libc::SO_TYPE)? == libc::SOCK_STREAM;
    if listening && stream && family.contains(&domain) {
        slot.take()
    } else {
        None
    }
}

/// An integer `SOL_SOCKET` option of a socket (`SO_DOMAIN`, `SO_ACCEPTCONN`, `SO_TYPE`...),
/// `None` when the descriptor is no socket or the option is unknown.
pub fn sockopt(fd: &OwnedFd, opt: libc::c_int) -> Option<libc::c_int> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `v` and `len` are valid for the call; the descriptor is open.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    (r == 0).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_listener_of_the_asked_family_is_adopted() {
        let dir = tempfile::tempdir().unwrap();
        let l = std::os::unix::net::UnixListener::bind(dir.path().join("s")).unwrap();
        offer(OwnedFd::from(l));
        assert!(adopt(&[libc::AF_INET, libc::AF_INET6]).is_none());
        assert!(adopt(&[libc::AF_UNIX]).is_some());
        assert!(adopt(&[libc::AF_UNIX]).is_none(), "adopted twice");
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        offer(OwnedFd::from(a));
        assert!(adopt(&[libc::AF_UNIX]).is_none(), "not a listener");
        discard();
    }
}
