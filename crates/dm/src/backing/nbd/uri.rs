//! NBD URIs as libnbd and qemu write them: `nbd://host[:port][/export]`,
//! `nbds://...` (TLS), `nbd+unix:///export?socket=PATH` and `nbds+unix://...`.

use std::path::PathBuf;

/// NBD's registered port.
pub const DEFAULT_PORT: u16 = 10809;

/// Where an NBD backing connects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NbdAddress {
    /// TCP to a host name or address and port.
    Tcp {
        /// Host name or IP address (IPv6 without brackets).
        host: String,
        /// Port.
        port: u16,
    },
    /// A Unix socket.
    Unix(PathBuf),
}

/// A parsed NBD URI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NbdUri {
    /// Where to connect.
    pub address: NbdAddress,
    /// The export's name ("" is the server's default export).
    pub export: String,
    /// STARTTLS is required (`nbds`).
    pub tls: bool,
    /// `tls-certificates=DIR`: ca-cert.pem (and client-cert.pem/client-key.pem) as libnbd
    /// reads them.
    pub tls_certificates: Option<PathBuf>,
}

/// Whether `spec` names an NBD backing (and should be parsed by [`NbdUri::parse`]).
pub fn is_nbd_uri(spec: &str) -> bool {
    ["nbd://", "nbds://", "nbd+unix://", "nbds+unix://"]
        .iter()
        .any(|p| spec.starts_with(p))
}

impl NbdUri {
    /// Parses an NBD URI; the error says what is wrong.
    pub fn parse(text: &str) -> Result<NbdUri, String> {
        let bad = |why: &str| format!("invalid NBD URI '{text}': {why}");
        let (scheme, rest) = text.split_once("://").ok_or_else(|| bad("no scheme"))?;
        let (tls, unix) = match scheme {
            "nbd" => (false, false),
            "nbds" => (true, false),
            "nbd+unix" => (false, true),
            "nbds+unix" => (true, true),
            _ => return Err(bad("the scheme must be nbd, nbds, nbd+unix or nbds+unix")),
        };
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        let export = percent_decode(path).ok_or_else(|| bad("bad %-escape in the export name"))?;
        let mut socket = None;
        let mut tls_certificates = None;
        for pair in query.into_iter().flat_map(|q| q.split('&')) {
            if pair.is_empty() {
                continue;
            }
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = percent_decode(value).ok_or_else(|| bad("bad %-escape in the query"))?;
            match key {
                "socket" => socket = Some(PathBuf::from(value)),
                "tls-certificates" => tls_certificates = Some(PathBuf::from(value)),
                _ => return Err(bad(&format!("unknown query parameter '{key}'"))),
            }
        }
        let address = if unix {
            if !authority.is_empty() {
                return Err(bad(
                    "a Unix socket URI has no host (nbd+unix:///export?socket=PATH)",
                ));
            }
            NbdAddress::Unix(socket.ok_or_else(|| bad("socket=PATH is missing"))?)
        } else {
            if socket.is_some() {
                return Err(bad("socket= belongs to nbd+unix URIs"));
            }
            let (host, port) = split_host_port(authority).ok_or_else(|| bad("bad host or port"))?;
            NbdAddress::Tcp { host, port }
        };
        if tls_certificates.is_some() && !tls {
            return Err(bad("tls-certificates needs the nbds scheme"));
        }
        Ok(NbdUri {
            address,
            export,
            tls,
            tls_certificates,
        })
    }
}

fn split_host_port(authority: &str) -> Option<(String, u16)> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        match after {
            "" => (host, None),
            p => (host, Some(p.strip_prefix(':')?)),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (h, Some(p)),
            Some(_) => return None,
            None => (authority, None),
        }
    };
    if host.is_empty() || host.contains(['@', '/', ' ']) {
        return None;
    }
    let port = match port {
        Some(p) => p.parse().ok().filter(|p| *p != 0)?,
        None => DEFAULT_PORT,
    };
    Some((host.to_string(), port))
}

fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(host: &str, port: u16) -> NbdAddress {
        NbdAddress::Tcp {
            host: host.into(),
            port,
        }
    }

    #[test]
    fn uris_parse_as_libnbd_writes_them() {
        let u = NbdUri::parse("nbd://example.org/disk").unwrap();
        assert_eq!(
            (u.address, u.export, u.tls),
            (tcp("example.org", 10809), "disk".into(), false)
        );
        let u = NbdUri::parse("nbds://127.0.0.1:1234/?tls-certificates=/etc/pki").unwrap();
        assert_eq!(u.address, tcp("127.0.0.1", 1234));
        assert_eq!(u.export, "");
        assert!(u.tls);
        assert_eq!(u.tls_certificates, Some(PathBuf::from("/etc/pki")));
        let u = NbdUri::parse("nbd://[::1]:99/a%20b").unwrap();
        assert_eq!((u.address, u.export), (tcp("::1", 99), "a b".into()));
        let u = NbdUri::parse("nbd+unix:///exp?socket=/run/x.sock").unwrap();
        assert_eq!(u.address, NbdAddress::Unix("/run/x.sock".into()));
        assert_eq!(u.export, "exp");
        assert!(NbdUri::parse("nbd://h").is_ok());
        for bad in [
            "nbd+unix:///e",
            "nbd+unix://host/e?socket=/x",
            "nbd://h:0/",
            "nbd://h:70000/",
            "nbd://:1/",
            "nbd://h/?socket=/x",
            "nbd://h/?frob=1",
            "nbd://h/?tls-certificates=/x",
            "nbd://::1/",
            "nbd://h/%zz",
            "http://h/",
        ] {
            assert!(NbdUri::parse(bad).is_err(), "{bad} accepted");
        }
        assert!(is_nbd_uri("nbds+unix:///?socket=/x"));
        assert!(!is_nbd_uri("/tmp/nbd://x"));
    }
}
