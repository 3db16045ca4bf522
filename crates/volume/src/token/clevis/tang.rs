//! The clevis `tang` pin: the McCallum-Relyea exchange with a tang server.
//!
//! At bind time clevis made an ephemeral key pair (c, C = cG), kept C in the JWE header as
//! `epk` and derived the content key from K = cS, S being the server's advertised
//! `deriveKey` key (the JWE header keeps the advertisement and names S by its thumbprint in
//! `kid`). To recover K without the server learning it: pick e, send X = C + eG to
//! `POST <url>/rec/<kid>`, receive Y = sX = K + eS, and compute K = Y - eS. The x
//! coordinate of K is the ECDH-ES shared secret of the JWE.
//!
//! HTTP is one request and one answer (tang speaks plain HTTP; clevis uses curl for it), so
//! it is written out on a `TcpStream` instead of bringing in an HTTP client stack.

use super::{bad, ecdh_es_cek, Jwe};
use crate::error::{ErrorClass, Result, VolumeError};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use cryptblk_cipher::SecretBytes;
use elliptic_curve::group::{Curve, Group};
use elliptic_curve::sec1::{FromEncodedPoint, ModulusSize, ToEncodedPoint};
use elliptic_curve::{AffinePoint, CurveArithmetic, FieldBytesSize, JwkEcKey, JwkParameters};
use elliptic_curve::{NonZeroScalar, PublicKey};
use serde_json::{json, Value};
use sha2::Digest;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long one exchange with a tang server may take by default, all of it: connecting,
/// sending the request and reading the whole answer. It bounds the exchange, not each
/// read (as systemd's `token-timeout=` bounds the token's unlock), so a server that drips
/// its answer a byte at a time cannot stretch it.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// The deadline of each exchange in milliseconds ([`set_timeout`]); 0: none.
static EXCHANGE_TIMEOUT_MS: AtomicU64 = AtomicU64::new(TIMEOUT.as_millis() as u64);

/// Sets how long each later exchange with a tang server may take in all (default
/// [`TIMEOUT`]). Zero turns the deadline off and waits for ever, as `token-timeout=0`
/// does in systemd's crypttab.
pub fn set_timeout(timeout: Duration) {
    let ms = if timeout.is_zero() {
        0
    } else {
        timeout.as_millis().clamp(1, u128::from(u64::MAX)) as u64
    };
    EXCHANGE_TIMEOUT_MS.store(ms, Ordering::Relaxed);
}

/// How long each exchange with a tang server may take in all; None: no limit.
pub fn timeout() -> Option<Duration> {
    match EXCHANGE_TIMEOUT_MS.load(Ordering::Relaxed) {
        0 => None,
        ms => Some(Duration::from_millis(ms)),
    }
}

/// The largest answer read from a tang server.
const MAX_REPLY: u64 = 1 << 20;

/// The JWE's content key, recovered through the tang server its header names.
pub fn recover_cek(jwe: &Jwe) -> Result<SecretBytes> {
    let h = &jwe.header;
    if h["alg"] != "ECDH-ES" {
        return Err(bad(format!(
            "tang JWE key management '{}' is not supported (clevis writes ECDH-ES)",
            h["alg"].as_str().unwrap_or("")
        )));
    }
    let epk = &h["epk"];
    let kid = h["kid"]
        .as_str()
        .ok_or_else(|| bad("the JWE lacks 'kid'"))?;
    let url = h["clevis"]["tang"]["url"]
        .as_str()
        .ok_or_else(|| bad("the JWE lacks clevis.tang.url"))?;
    let keys = h["clevis"]["tang"]["adv"]["keys"]
        .as_array()
        .ok_or_else(|| bad("the JWE lacks clevis.tang.adv"))?;
    let srv = keys
        .iter()
        .find(|k| thumbprint(k).as_deref() == Some(kid))
        .ok_or_else(|| bad("no advertised key matches the JWE's kid"))?;
    let exchange = |x: Value| -> Result<Value> {
        let body = post(url, &format!("/rec/{kid}"), &x.to_string())?;
        serde_json::from_slice(&body).map_err(|_| tang_err(url, "the server's reply is not JSON"))
    };
    let z = match epk["crv"].as_str() {
        Some("P-256") => recover::<p256::NistP256>(epk, srv, exchange)?,
        Some("P-384") => recover::<p384::NistP384>(epk, srv, exchange)?,
        Some("P-521") => recover::<p521::NistP521>(epk, srv, exchange)?,
        other => {
            return Err(bad(format!(
                "curve {} is not supported",
                other.unwrap_or("(none)")
            )))
        }
    };
    ecdh_es_cek(h, z.as_bytes())
}

/// The RFC 7638 SHA-256 thumbprint of an EC JWK (how tang names its keys); None for
/// anything else.
pub fn thumbprint(jwk: &Value) -> Option<String> {
    if jwk["kty"] != "EC" {
        return None;
    }
    // Members in lexicographic order, no whitespace, as RFC 7638 requires.
    let canon = format!(
        "{{\"crv\":{},\"kty\":\"EC\",\"x\":{},\"y\":{}}}",
        jwk.get("crv")?,
        jwk.get("x")?,
        jwk.get("y")?
    );
    Some(URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(canon.as_bytes())))
}

fn public_key<C>(jwk: &Value, what: &str) -> Result<PublicKey<C>>
where
    C: CurveArithmetic + JwkParameters,
    AffinePoint<C>: FromEncodedPoint<C> + ToEncodedPoint<C>,
    FieldBytesSize<C>: ModulusSize,
{
    // Only the members the point needs: advertisements carry alg and key_ops besides.
    let minimal = json!({"kty": "EC", "crv": jwk["crv"], "x": jwk["x"], "y": jwk["y"]});
    let key: JwkEcKey =
        serde_json::from_value(minimal).map_err(|_| bad(format!("{what} is not an EC JWK")))?;
    key.to_public_key::<C>()
        .map_err(|_| bad(format!("{what} is not a point of its curve")))
}

/// The McCallum-Relyea recovery on curve `C`: K's x coordinate, from the client key `epk`,
/// the server key `srv` and one `exchange` (X in, Y out, both as JWKs).
fn recover<C>(
    epk: &Value,
    srv: &Value,
    exchange: impl FnOnce(Value) -> Result<Value>,
) -> Result<SecretBytes>
where
    C: CurveArithmetic + JwkParameters,
    AffinePoint<C>: FromEncodedPoint<C> + ToEncodedPoint<C>,
    FieldBytesSize<C>: ModulusSize,
{
    let c = public_key::<C>(epk, "the JWE's epk")?;
    let s = public_key::<C>(srv, "the server's key")?;
    let e = NonZeroScalar::<C>::random(&mut rand_core::OsRng);
    let x = c.to_projective() + C::ProjectivePoint::generator() * *e;
    let x = PublicKey::<C>::from_affine(x.to_affine())
        .map_err(|_| bad("the exchange point is the identity"))?;
    let mut xjwk: Value = serde_json::from_str(&x.to_jwk_string())
        .map_err(|_| bad("cannot encode the exchange key"))?;
    xjwk["alg"] = Value::String("ECMR".into());
    let reply = exchange(xjwk)?;
    let y = public_key::<C>(&reply, "the server's reply")?;
    let k = (y.to_projective() - s.to_projective() * *e).to_affine();
    let k = PublicKey::<C>::from_affine(k).map_err(|_| bad("the recovered key is the identity"))?;
    let point = k.as_affine().to_encoded_point(false);
    let xcoord = point
        .x()
        .ok_or_else(|| bad("the recovered key has no x coordinate"))?;
    Ok(SecretBytes::from_slice(xcoord))
}

/// A tang server's advertisement whose signatures checked out.
#[derive(Clone, Debug)]
pub struct Advertisement {
    /// The advertised JWK set (`{"keys":[...]}`), as clevis stores it in the JWE header.
    pub keys: Value,
    /// Thumbprints (RFC 7638, SHA-256) of the signing keys: what a user compares with the
    /// server's `tang-show-keys` before trusting it.
    pub signing: Vec<String>,
}

/// Fetches `<url>/adv` and checks that every advertised signing key (`key_ops` `verify`)
/// signed the advertised key set (ES256, ES384 or ES512), as clevis checks it.
pub fn advertisement(url: &str) -> Result<Advertisement> {
    let body = get(url, "/adv")?;
    let jws: Value = serde_json::from_slice(&body)
        .map_err(|_| tang_err(url, "the advertisement is not JSON"))?;
    verify_advertisement(url, &jws)
}

/// The checks of [`advertisement`] on a JWS already fetched.
pub fn verify_advertisement(url: &str, jws: &Value) -> Result<Advertisement> {
    let bad_adv = |what: &str| tang_err(url, format!("bad advertisement: {what}"));
    let payload_b64 = jws["payload"]
        .as_str()
        .ok_or_else(|| bad_adv("no payload"))?;
    let keys: Value = serde_json::from_slice(&super::b64(payload_b64, "payload")?)
        .map_err(|_| bad_adv("payload is not JSON"))?;
    let list = keys["keys"]
        .as_array()
        .ok_or_else(|| bad_adv("payload is not a key set"))?;
    // Flattened (one signature) or general (a "signatures" array) serialization.
    let sigs: Vec<&Value> = match jws["signatures"].as_array() {
        Some(a) => a.iter().collect(),
        None => vec![jws],
    };
    let has_op = |k: &Value, op: &str| {
        k["key_ops"]
            .as_array()
            .is_some_and(|a| a.iter().any(|o| o == op))
    };
    let mut signing = Vec::new();
    for key in list.iter().filter(|k| has_op(k, "verify")) {
        let ok = sigs.iter().any(|sig| {
            let (Some(prot), Some(sigval)) = (sig["protected"].as_str(), sig["signature"].as_str())
            else {
                return false;
            };
            let msg = format!("{prot}.{payload_b64}");
            let (Ok(raw), Ok(hdr)) = (
                super::b64(sigval, "signature"),
                super::b64(prot, "protected"),
            ) else {
                return false;
            };
            let alg = serde_json::from_slice::<Value>(&hdr)
                .ok()
                .and_then(|h| h["alg"].as_str().map(str::to_string))
                .unwrap_or_default();
            verify_es(key, &alg, msg.as_bytes(), &raw)
        });
        if !ok {
            return Err(bad_adv("a signing key did not sign the key set"));
        }
        signing.push(thumbprint(key).unwrap_or_default());
    }
    if signing.is_empty() {
        return Err(bad_adv("no signing key"));
    }
    if !list.iter().any(|k| has_op(k, "deriveKey")) {
        return Err(bad_adv("no exchange (deriveKey) key"));
    }
    Ok(Advertisement { keys, signing })
}

/// An ECDSA JWS signature (raw r||s) by the EC JWK `key` with JWS algorithm `alg`.
fn verify_es(key: &Value, alg: &str, msg: &[u8], sig: &[u8]) -> bool {
    use elliptic_curve::sec1::ToEncodedPoint as _;
    use p256::ecdsa::signature::Verifier;
    fn sec1<C>(key: &Value) -> Option<Vec<u8>>
    where
        C: CurveArithmetic + JwkParameters,
        AffinePoint<C>: FromEncodedPoint<C> + ToEncodedPoint<C>,
        FieldBytesSize<C>: ModulusSize,
    {
        let pk = public_key::<C>(key, "key").ok()?;
        Some(pk.as_affine().to_encoded_point(false).as_bytes().to_vec())
    }
    match (alg, key["crv"].as_str()) {
        ("ES256", Some("P-256")) => (|| {
            let vk =
                p256::ecdsa::VerifyingKey::from_sec1_bytes(&sec1::<p256::NistP256>(key)?).ok()?;
            let s = p256::ecdsa::Signature::from_slice(sig).ok()?;
            vk.verify(msg, &s).ok()
        })()
        .is_some(),
        ("ES384", Some("P-384")) => (|| {
            let vk =
                p384::ecdsa::VerifyingKey::from_sec1_bytes(&sec1::<p384::NistP384>(key)?).ok()?;
            let s = p384::ecdsa::Signature::from_slice(sig).ok()?;
            vk.verify(msg, &s).ok()
        })()
        .is_some(),
        ("ES512", Some("P-521")) => (|| {
            let vk =
                p521::ecdsa::VerifyingKey::from_sec1_bytes(&sec1::<p521::NistP521>(key)?).ok()?;
            let s = p521::ecdsa::Signature::from_slice(sig).ok()?;
            vk.verify(msg, &s).ok()
        })()
        .is_some(),
        _ => false,
    }
}

/// Encrypts `plaintext` to the tang server as `clevis encrypt tang` does: an ECDH-ES
/// (A256GCM) JWE to the advertised exchange key, whose header carries the advertisement and
/// the URL. Returns the flattened JWE (`protected`, `encrypted_key`, `iv`, `ciphertext`,
/// `tag`) as a clevis LUKS2 token holds it.
pub fn encrypt(url: &str, adv: &Advertisement, plaintext: &[u8]) -> Result<Value> {
    let derive = adv.keys["keys"]
        .as_array()
        .and_then(|l| {
            l.iter().find(|k| {
                k["key_ops"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|o| o == "deriveKey"))
            })
        })
        .ok_or_else(|| tang_err(url, "no exchange (deriveKey) key advertised"))?;
    let kid = thumbprint(derive).ok_or_else(|| tang_err(url, "exchange key is not EC"))?;
    let (epk, z) = match derive["crv"].as_str() {
        Some("P-256") => agree::<p256::NistP256>(derive)?,
        Some("P-384") => agree::<p384::NistP384>(derive)?,
        Some("P-521") => agree::<p521::NistP521>(derive)?,
        other => {
            return Err(bad(format!(
                "curve {} is not supported",
                other.unwrap_or("(none)")
            )))
        }
    };
    let header = json!({
        "alg": "ECDH-ES",
        "clevis": {"pin": "tang", "tang": {"adv": adv.keys, "url": url}},
        "enc": "A256GCM",
        "epk": epk,
        "kid": kid,
    });
    let cek = ecdh_es_cek(&header, z.as_bytes())?;
    let protected = URL_SAFE_NO_PAD.encode(header.to_string());
    let iv = cryptblk_cipher::SecretBytes::random(12);
    let mut ct = plaintext.to_vec();
    use aes_gcm::aead::AeadInPlace;
    use aes_gcm::KeyInit;
    let tag = aes_gcm::Aes256Gcm::new_from_slice(cek.as_bytes())
        .map_err(|_| bad("bad key"))?
        .encrypt_in_place_detached(
            aes_gcm::Nonce::from_slice(iv.as_bytes()),
            protected.as_bytes(),
            &mut ct,
        )
        .map_err(|_| bad("encryption failed"))?;
    Ok(json!({
        "ciphertext": URL_SAFE_NO_PAD.encode(&ct),
        "encrypted_key": "",
        "iv": URL_SAFE_NO_PAD.encode(iv.as_bytes()),
        "protected": protected,
        "tag": URL_SAFE_NO_PAD.encode(tag),
    }))
}

/// Ephemeral-static ECDH to the server key `srv`: the client's public key (the JWE's
/// `epk`, members in clevis's order) and the shared x coordinate.
fn agree<C>(srv: &Value) -> Result<(Value, SecretBytes)>
where
    C: CurveArithmetic + JwkParameters,
    AffinePoint<C>: FromEncodedPoint<C> + ToEncodedPoint<C>,
    FieldBytesSize<C>: ModulusSize,
{
    let s = public_key::<C>(srv, "the server's key")?;
    let c = NonZeroScalar::<C>::random(&mut rand_core::OsRng);
    let cpub = PublicKey::<C>::from_secret_scalar(&c);
    let k = (s.to_projective() * *c).to_affine();
    let k = PublicKey::<C>::from_affine(k).map_err(|_| bad("the shared key is the identity"))?;
    let point = k.as_affine().to_encoded_point(false);
    let x = point.x().ok_or_else(|| bad("no x coordinate"))?;
    let epk: Value = serde_json::from_str(&cpub.to_jwk_string())
        .map_err(|_| bad("cannot encode the ephemeral key"))?;
    let epk = json!({"crv": epk["crv"], "kty": "EC", "x": epk["x"], "y": epk["y"]});
    Ok((epk, SecretBytes::from_slice(x)))
}

fn tang_err(url: &str, what: impl std::fmt::Display) -> VolumeError {
    VolumeError::new(
        ErrorClass::WrongDevice,
        format!("tang server {url}: {what}"),
    )
}

/// `http://host[:port][/prefix]` split into the authority and the path prefix.
fn split_url(url: &str) -> Result<(String, u16, String)> {
    let rest = url.strip_prefix("http://").ok_or_else(|| {
        tang_err(
            url,
            "only http:// URLs are supported (tang itself speaks plain HTTP)",
        )
    })?;
    let (auth, path) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    let (host, port) = if let Some(v6) = auth.strip_prefix('[') {
        let (h, p) = v6
            .split_once(']')
            .ok_or_else(|| tang_err(url, "bad IPv6 address"))?;
        (h.to_string(), p.strip_prefix(':').unwrap_or(""))
    } else {
        match auth.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), p),
            None => (auth.to_string(), ""),
        }
    };
    let port = if port.is_empty() {
        80
    } else {
        port.parse().map_err(|_| tang_err(url, "bad port"))?
    };
    if host.is_empty() {
        return Err(tang_err(url, "no host"));
    }
    Ok((host, port, path.to_string()))
}

/// One HTTP/1.1 POST of a JWK to `url` + `path`; the body of a 200 answer.
pub fn post(url: &str, path: &str, body: &str) -> Result<Vec<u8>> {
    request(url, "POST", path, Some(body))
}

/// One HTTP/1.1 GET of `url` + `path`; the body of a 200 answer.
pub fn get(url: &str, path: &str) -> Result<Vec<u8>> {
    request(url, "GET", path, None)
}

fn request(url: &str, method: &str, path: &str, body: Option<&str>) -> Result<Vec<u8>> {
    let limit = timeout();
    let deadline = limit.and_then(|l| Instant::now().checked_add(l));
    let timed_out = || {
        let within = limit.map(|l| format!(" within {l:?}")).unwrap_or_default();
        tang_err(url, format!("timed out (no whole answer{within})"))
    };
    // What is left of the deadline (None: no deadline), or the timeout error once it has
    // passed.
    let left = || match deadline {
        None => Ok(None),
        Some(d) => {
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                Err(timed_out())
            } else {
                Ok(Some(left))
            }
        }
    };
    // A socket timeout shows as EAGAIN ("Resource temporarily unavailable"): name it.
    let io = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => timed_out(),
        _ => tang_err(url, e),
    };
    let (host, port, prefix) = split_url(url)?;
    let addrs: Vec<_> = (host.as_str(), port)
        .to_socket_addrs()
        .map_err(|e| tang_err(url, format!("cannot resolve {host}: {e}")))?
        .collect();
    let mut last = None;
    let mut stream = None;
    for a in &addrs {
        let attempt = match left()? {
            Some(l) => TcpStream::connect_timeout(a, l),
            None => TcpStream::connect(a),
        };
        match attempt {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let mut stream = stream.ok_or_else(|| match &last {
        Some(e) if e.kind() == std::io::ErrorKind::TimedOut => timed_out(),
        _ => tang_err(
            url,
            format!(
                "unreachable ({})",
                last.map(|e| e.to_string()).unwrap_or("no address".into())
            ),
        ),
    })?;
    let authority = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let req = match body {
        Some(body) => format!(
            "{method} {prefix}{path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: \
             application/jwk+json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
        None => format!(
            "{method} {prefix}{path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n"
        ),
    };
    // Each write and read waits at most what is left of the one deadline.
    let mut out = req.as_bytes();
    while !out.is_empty() {
        stream.set_write_timeout(left()?).map_err(io)?;
        match stream.write(out) {
            Ok(0) => return Err(tang_err(url, "the connection closed")),
            Ok(n) => out = &out[n..],
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io(e)),
        }
    }
    // tangd answers and then waits for more requests until the connection closes, so the
    // answer ends where its Content-Length says, not at end of file.
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(done) = complete(&reply) {
            reply.truncate(done);
            break;
        }
        stream.set_read_timeout(left()?).map_err(io)?;
        let n = match stream.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io(e)),
        };
        if n == 0 {
            break;
        }
        reply.extend_from_slice(&buf[..n]);
        if reply.len() as u64 > MAX_REPLY {
            return Err(tang_err(url, "answer too long"));
        }
    }
    parse_reply(url, &reply)
}

/// The length of a whole HTTP answer with a Content-Length at the start of `reply`, once all
/// of it has arrived (answers without one end at end of file).
fn complete(reply: &[u8]) -> Option<usize> {
    let end = reply.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&reply[..end]).ok()?;
    let len: usize = head.split("\r\n").find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse().ok())
            .flatten()
    })?;
    (reply.len() >= end + 4 + len).then_some(end + 4 + len)
}

/// The body of an HTTP answer, or the status line as the error.
fn parse_reply(url: &str, reply: &[u8]) -> Result<Vec<u8>> {
    let end = reply
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| tang_err(url, "incomplete HTTP answer"))?;
    let head = String::from_utf8_lossy(&reply[..end]);
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap_or("");
    let code = status.split_whitespace().nth(1).unwrap_or("");
    if code != "200" {
        return Err(tang_err(url, format!("answered '{status}'")));
    }
    let mut body = reply[end + 4..].to_vec();
    let mut chunked = false;
    for l in lines {
        let (k, v) = l.split_once(':').unwrap_or((l, ""));
        let v = v.trim();
        if k.eq_ignore_ascii_case("content-length") {
            let n: usize = v.parse().map_err(|_| tang_err(url, "bad Content-Length"))?;
            if body.len() < n {
                return Err(tang_err(url, "truncated HTTP answer"));
            }
            body.truncate(n);
        } else if k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked") {
            chunked = true;
        }
    }
    if chunked {
        body = dechunk(&body).ok_or_else(|| tang_err(url, "bad chunked HTTP answer"))?;
    }
    Ok(body)
}

fn dechunk(mut data: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let nl = data.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&data[..nl]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        data = &data[nl + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(data.get(..size)?);
        data = data.get(size + 2..)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            split_url("http://127.0.0.1:8080").unwrap(),
            ("127.0.0.1".into(), 8080, "".into())
        );
        assert_eq!(
            split_url("http://tang.example/p/").unwrap(),
            ("tang.example".into(), 80, "/p".into())
        );
        assert_eq!(
            split_url("http://[::1]:99/x").unwrap(),
            ("::1".into(), 99, "/x".into())
        );
        assert!(split_url("https://x").is_err());
        assert!(split_url("http://:80").is_err());
        assert!(split_url("http://h:99999").is_err());
    }

    #[test]
    fn replies() {
        let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}junk";
        assert_eq!(parse_reply("u", ok).unwrap(), b"{}");
        let chunked =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{\r\n1\r\n}\r\n0\r\n\r\n";
        assert_eq!(parse_reply("u", chunked).unwrap(), b"{}");
        assert!(parse_reply("u", b"HTTP/1.1 404 Not Found\r\n\r\n").is_err());
        assert!(parse_reply("u", b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{}").is_err());
        assert!(parse_reply("u", b"garbage").is_err());
    }

    /// An advertisement signed by its verify key passes; a changed key set, a missing
    /// signature or no exchange key fail.
    #[test]
    fn advertisement_signatures() {
        use p256::ecdsa::signature::Signer;
        let sk = p256::ecdsa::SigningKey::random(&mut rand_core::OsRng);
        let vpub = PublicKey::<p256::NistP256>::from(sk.verifying_key());
        let dpub = PublicKey::<p256::NistP256>::from_secret_scalar(&NonZeroScalar::random(
            &mut rand_core::OsRng,
        ));
        let jwk = |p: &PublicKey<p256::NistP256>, op: &str, alg: &str| {
            let mut v: Value = serde_json::from_str(&p.to_jwk_string()).unwrap();
            v["key_ops"] = json!([op]);
            v["alg"] = json!(alg);
            v
        };
        let sign = |keys: &Value| {
            let payload = URL_SAFE_NO_PAD.encode(keys.to_string());
            let prot = URL_SAFE_NO_PAD.encode(r#"{"alg":"ES256","cty":"jwk-set+json"}"#);
            let sig: p256::ecdsa::Signature = sk.sign(format!("{prot}.{payload}").as_bytes());
            json!({"payload": payload, "protected": prot,
                   "signature": URL_SAFE_NO_PAD.encode(sig.to_bytes())})
        };
        let keys =
            json!({"keys": [jwk(&vpub, "verify", "ES256"), jwk(&dpub, "deriveKey", "ECMR")]});
        let adv = verify_advertisement("u", &sign(&keys)).unwrap();
        assert_eq!(adv.signing, vec![thumbprint(&keys["keys"][0]).unwrap()]);
        let mut jws = sign(&keys);
        let other =
            json!({"keys": [jwk(&vpub, "verify", "ES256"), jwk(&vpub, "deriveKey", "ECMR")]});
        jws["payload"] = json!(URL_SAFE_NO_PAD.encode(other.to_string()));
        assert!(verify_advertisement("u", &jws).is_err());
        let mut unsigned = sign(&keys);
        unsigned["signature"] = json!("");
        assert!(verify_advertisement("u", &unsigned).is_err());
        let no_derive = json!({"keys": [jwk(&vpub, "verify", "ES256")]});
        assert!(verify_advertisement("u", &sign(&no_derive)).is_err());
    }

    /// The exchange against a server simulated in process: the recovered point is cS.
    #[test]
    fn mccallum_relyea_math() {
        use p256::NistP256;
        let s = NonZeroScalar::<NistP256>::random(&mut rand_core::OsRng);
        let c = NonZeroScalar::<NistP256>::random(&mut rand_core::OsRng);
        let spub = PublicKey::<NistP256>::from_secret_scalar(&s);
        let cpub = PublicKey::<NistP256>::from_secret_scalar(&c);
        let srv: Value = serde_json::from_str(&spub.to_jwk_string()).unwrap();
        let epk: Value = serde_json::from_str(&cpub.to_jwk_string()).unwrap();
        let z = recover::<NistP256>(&epk, &srv, |x| {
            let xp = public_key::<NistP256>(&x, "x").unwrap();
            let y =
                PublicKey::<NistP256>::from_affine((xp.to_projective() * *s).to_affine()).unwrap();
            Ok(serde_json::from_str(&y.to_jwk_string()).unwrap())
        })
        .unwrap();
        let k = (spub.to_projective() * *c).to_affine();
        assert_eq!(
            z.as_bytes(),
            k.to_encoded_point(false).x().unwrap().as_slice()
        );
    }
}
