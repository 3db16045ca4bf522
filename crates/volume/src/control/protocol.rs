//! The control protocol as types: what a client asks a daemon ([`Request`]) and what it
//! answers ([`Response`]), one JSON line each way.
//!
//! A request travels in a versioned envelope, `{"v":1,"request":{"cmd":"status"}}`. The
//! request sits inside the envelope rather than beside `v` so that a daemon from before
//! versions (protocol 0, which read `cmd` at the top level) sees no command and answers
//! "unknown request" without acting on it: a newer client can never suspend, reload or close
//! an older daemon by accident before it notices the mismatch. Every answer carries the
//! daemon's version too: `{"v":1,"ok":true,...payload}` or
//! `{"v":1,"ok":false,"code":<exit class>,"error":"<message>"}`.

use crate::error::{ErrorClass, VolumeError};
use cryptblk_cipher::SecretText;
pub use cryptblk_export::ExportDescription;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt;
use zeroize::Zeroize;

/// The control protocol this build speaks. Raise it whenever a request or an answer changes
/// meaning or shape; daemons and clients of different versions refuse each other.
pub const PROTOCOL_VERSION: u32 = 1;

/// A control request, as the daemon serving a mapping receives it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    /// The mapping's [`Status`] report.
    Status,
    /// The live table; crypt keys and keyed integrity options only if `showkeys`.
    Table {
        /// Show key material instead of hiding it.
        #[serde(default)]
        showkeys: bool,
    },
    /// Flush, stop the export and end the daemon (the top mapping), or remove one lower
    /// mapping of the stack (`dm remove` of a lower name). Refused (busy, "Device NAME is
    /// still in use.") while the export has users or a suspend holds I/O.
    Close,
    /// `close --deferred`: close the top mapping once its last user has gone (at once if it
    /// has none), as the kernel's deferred removal. Its own command rather than a flag on
    /// [`Request::Close`], so a daemon that predates it refuses it instead of closing.
    CloseDeferred,
    /// `close --cancel-deferred`: forget a [`Request::CloseDeferred`]; the volume stays
    /// open (nothing to do if none was asked for, as the kernel's).
    CancelDeferredClose,
    /// Suspend I/O (waits for requests in flight).
    Suspend,
    /// Resume I/O, swapping in a table staged by [`Request::Reload`].
    Resume,
    /// Stage a new table, made live by the next [`Request::Resume`].
    Reload {
        /// The table text, keys included (never shown in `Debug`, wiped on drop).
        table: String,
    },
    /// Replace the activation flags of every crypt line live (reload, suspend, resume).
    Refresh {
        /// The crypt flags as dm table words (`allow_discards`, `no_read_workqueue`, ...).
        #[serde(default)]
        flags: Vec<String>,
    },
    /// `dmsetup message`: a message to the target that covers `sector`.
    Message {
        /// A sector inside the target the message is for.
        sector: u64,
        /// The message words (crypt's `key set <hex>` holds a key: never shown in `Debug`,
        /// wiped on drop).
        message: Vec<String>,
    },
    /// Start re-keying the served LUKS2 volume in the background (online reencryption);
    /// its header must already hold the reencryption (`reencrypt` keyslot and segments).
    /// Answered once the run started; `status` reports its progress.
    Reencrypt {
        /// The old volume key in hex (never shown in `Debug`, wiped on drop).
        old_key: String,
        /// The new volume key in hex (never shown in `Debug`, wiped on drop).
        new_key: String,
        /// `--hotzone-size` in bytes.
        #[serde(default)]
        max_hotzone: Option<u64>,
        /// The data device's block size (hotzones align to it).
        #[serde(default)]
        device_block: u32,
    },
    /// Start decrypting the served LUKS2 volume whose header is on its data device, the
    /// header exported to `export` (see
    /// [`crate::reencrypt::online::start_decrypt_export`]). Answered once the run
    /// started; `status` reports its progress and `export` as the header.
    DecryptExport {
        /// The volume key in hex (never shown in `Debug`, wiped on drop).
        key: String,
        /// The new header file (absolute path; created empty by the caller).
        export: String,
        /// `--resilience` of the hotzones: `checksum`, `journal` or `none`.
        resilience: String,
        /// `--resilience-hash`.
        resilience_hash: String,
        /// `--hotzone-size` in bytes.
        #[serde(default)]
        max_hotzone: Option<u64>,
        /// The data device's block size (hotzones align to it).
        #[serde(default)]
        device_block: u32,
    },
    /// `upgrade`: replace the serving daemon by a new process running `binary` (absolute
    /// path), which takes over the volume, its key (through a pipe only the two share) and
    /// its listening sockets. Answered once the successor serves (the answering daemon then
    /// exits), or refused with the old daemon still serving.
    Upgrade {
        /// The program the successor runs (`cryptblk`, as installed now).
        binary: String,
    },
}

impl Drop for Request {
    fn drop(&mut self) {
        match self {
            Request::Reload { table } => zeroize::Zeroize::zeroize(table),
            Request::Reencrypt {
                old_key, new_key, ..
            } => {
                old_key.zeroize();
                new_key.zeroize();
            }
            Request::DecryptExport { key, .. } => key.zeroize(),
            Request::Message { message, .. } => {
                message.iter_mut().for_each(zeroize::Zeroize::zeroize)
            }
            _ => {}
        }
    }
}

impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Request::Status => f.write_str("Status"),
            Request::Table { showkeys } => {
                f.debug_struct("Table").field("showkeys", showkeys).finish()
            }
            Request::Close => f.write_str("Close"),
            Request::CloseDeferred => f.write_str("CloseDeferred"),
            Request::CancelDeferredClose => f.write_str("CancelDeferredClose"),
            Request::Suspend => f.write_str("Suspend"),
            Request::Resume => f.write_str("Resume"),
            // The table may hold a volume key.
            Request::Reload { .. } => f.write_str("Reload { .. }"),
            Request::Refresh { flags } => f.debug_struct("Refresh").field("flags", flags).finish(),
            // The words may hold a key (`key set <hex>`).
            Request::Message { sector, .. } => {
                write!(f, "Message {{ sector: {sector}, .. }}")
            }
            // Both fields are volume keys.
            Request::Reencrypt { max_hotzone, .. } => {
                write!(f, "Reencrypt {{ max_hotzone: {max_hotzone:?}, .. }}")
            }
            // The key is the volume key.
            Request::DecryptExport { export, .. } => {
                write!(f, "DecryptExport {{ export: {export:?}, .. }}")
            }
            Request::Upgrade { binary } => {
                f.debug_struct("Upgrade").field("binary", binary).finish()
            }
        }
    }
}

/// The envelope a request travels in.
#[derive(Serialize, Deserialize)]
struct RequestEnvelope<R> {
    v: u32,
    request: R,
}

impl Request {
    /// The request as one line on the wire (newline included), in the envelope of
    /// [`PROTOCOL_VERSION`].
    pub fn encode(&self) -> String {
        let env = RequestEnvelope {
            v: PROTOCOL_VERSION,
            request: self,
        };
        let mut line = serde_json::to_string(&env).expect("requests serialise");
        line.push('\n');
        line
    }

    /// The daemon's side of [`Request::encode`]: the request in `line`, or the error answer
    /// for a malformed request or one of another protocol version.
    pub fn decode(line: &str) -> Result<Request, Response> {
        let value: Value = serde_json::from_str(line).map_err(|e| {
            Response::error(
                ErrorClass::WrongParameters,
                format!("malformed request: {e}"),
            )
        })?;
        // A request without `v` comes from a cryptblk older than versions: protocol 0.
        let version = value.get("v").map_or(Some(0), Value::as_u64);
        if version != Some(u64::from(PROTOCOL_VERSION)) {
            let theirs = version.map_or_else(|| value["v"].to_string(), |v| v.to_string());
            return Err(Response::error(
                ErrorClass::WrongParameters,
                format!(
                    "this daemon speaks control protocol {PROTOCOL_VERSION}, the request is \
                     protocol {theirs}; use the cryptblk version that opened the volume"
                ),
            ));
        }
        let env: RequestEnvelope<Request> = serde_json::from_value(value).map_err(|e| {
            Response::error(
                ErrorClass::WrongParameters,
                format!("malformed request: {e}"),
            )
        })?;
        Ok(env.request)
    }
}

/// How a crypt line's I/O in one direction is processed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Queueing {
    /// In the submitting thread (`no_read_workqueue` / `no_write_workqueue`).
    Inline,
    /// Through the crypt worker queue.
    Queued,
}

impl From<cryptblk_dm::PipelineInfo> for Pipeline {
    fn from(p: cryptblk_dm::PipelineInfo) -> Self {
        let queueing = |how: &str| {
            if how == "inline" {
                Queueing::Inline
            } else {
                Queueing::Queued
            }
        };
        Pipeline {
            start: p.start,
            read: queueing(p.read),
            write: queueing(p.write),
            flags: p.flags,
        }
    }
}

impl Queueing {
    /// The word `status` prints: `inline` or `queued`.
    pub fn as_str(self) -> &'static str {
        match self {
            Queueing::Inline => "inline",
            Queueing::Queued => "queued",
        }
    }
}

/// The pipeline of one crypt line of the live table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pipeline {
    /// Start sector of the line.
    pub start: u64,
    /// How reads are decrypted.
    pub read: Queueing,
    /// How writes are encrypted.
    pub write: Queueing,
    /// The line's optional arguments as the kernel prints them.
    pub flags: Vec<String>,
}

/// The answer to [`Request::Status`]: the fields `cryptblk status --json` prints.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// The mapping's name.
    pub name: String,
    /// Facts the opener recorded (volume type, device, UUID, cipher, ...), never secrets; a
    /// lower mapping says which mapping serves it (`stacked_under`).
    pub info: crate::facts::VolumeFacts,
    /// Size of the live table in bytes.
    pub size: u64,
    /// True while suspended.
    pub suspended: bool,
    /// Requests in flight.
    pub inflight: u64,
    /// Requests held by a suspend (they run on resume); left out when there are none (the
    /// report keeps its old shape), and absent from daemons that predate it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub held: u64,
    /// Served read-only.
    pub readonly: bool,
    /// The live table, keys hidden.
    pub table: String,
    /// The live status line(s).
    pub status: String,
    /// One entry per crypt line of the live table.
    pub pipeline: Vec<Pipeline>,
    /// The export (none for a lower mapping).
    pub export: ExportDescription,
    /// The stack's lower mappings, in creation order (empty for a lower mapping).
    pub lower: Vec<String>,
    /// The daemon's process id.
    pub pid: u32,
    /// Remote backing stores of the daemon's tables and their failed requests; left out
    /// when there are none (file-backed volumes keep the report's old shape), and absent
    /// from daemons that predate it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backings: Vec<BackingStatus>,
    /// A LUKS2 reencryption of the served volume (opened mid-reencryption or re-keyed
    /// online) and its progress; left out otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reencryption: Option<crate::reencrypt::ReencryptProgress>,
    /// Users of the export now (NBD connections, opens of the FUSE file, an attached
    /// vhost-user frontend, holders of the ublk device): `close` refuses while not 0, and
    /// the plain report says "is active and is in use." (0 from daemons that predate it).
    #[serde(default)]
    pub users: u64,
    /// `close --deferred` is pending: the daemon closes when the last user goes.
    #[serde(default)]
    pub deferred_remove: bool,
    /// Request statistics of the mapping since it was created, monotonic across `refresh`
    /// (default from daemons that predate them).
    #[serde(default)]
    pub io: super::io_report::IoReport,
    /// Counters of each target of the live table that reports any, in table order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<super::io_report::TargetReport>,
}

/// serde's test for leaving a zero count out of a report.
fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A remote backing store (`rbd:...`) in a [`Status`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackingStatus {
    /// The device as the table names it.
    pub device: String,
    /// Requests the store failed (each one an `EIO` to the caller) since it was opened.
    pub errors: u64,
}

impl Status {
    /// The export's kind as its description is tagged (`nbd`, `ublk`, `fuse`, `vhostuser`,
    /// `none`).
    pub fn export_kind(&self) -> String {
        serde_json::to_value(&self.export)
            .ok()
            .and_then(|e| e.get("kind")?.as_str().map(str::to_owned))
            .unwrap_or_default()
    }

    /// The report as `cryptblk status --json` prints it: `"ok": true`, then the fields in
    /// declaration order (the shape scripts read before the protocol had versions).
    pub fn to_json(&self) -> Value {
        let mut out = serde_json::Map::new();
        out.insert("ok".into(), Value::Bool(true));
        if let Value::Object(fields) = serde_json::to_value(self).expect("status serialises") {
            out.extend(fields);
        }
        Value::Object(out)
    }
}

/// A daemon's answer to one [`Request`].
#[derive(Clone, Debug, PartialEq)]
pub enum Response {
    /// Done, nothing to report (`close`, `suspend`, `resume`, `reload`).
    Done,
    /// The report asked for by [`Request::Status`].
    Status(Box<Status>),
    /// A table: the live one for [`Request::Table`], the new one after [`Request::Refresh`]
    /// (locked text, wiped on drop: it may hold keys).
    Table(SecretText),
    /// The target's reply to [`Request::Message`], if it gave one.
    Message(Option<String>),
    /// The answer to [`Request::CloseDeferred`]: `pending` when users remain and the
    /// volume closes after the last one (false: it had none and is closing now).
    CloseDeferred {
        /// The close waits for the last user.
        pending: bool,
    },
    /// The request was refused.
    Error {
        /// The error class (cryptsetup's exit code).
        class: ErrorClass,
        /// One line for the user.
        message: String,
    },
}

/// Payload fields of an answer on the wire, after `v` and `ok`.
#[derive(Serialize)]
#[serde(untagged)]
enum WireBody<'a> {
    Done {},
    Status(&'a Status),
    Table { table: &'a str },
    Message { reply: Option<&'a str> },
    CloseDeferred { pending: bool },
    Error { code: i32, error: &'a str },
}

#[derive(Serialize)]
struct WireAnswer<'a> {
    v: u32,
    ok: bool,
    #[serde(flatten)]
    body: WireBody<'a>,
}

/// How a client reads an answer: the daemon's version, then success or refusal.
#[derive(Deserialize)]
struct WireHead {
    v: Option<u64>,
    #[serde(default)]
    ok: bool,
    code: Option<i64>,
    error: Option<String>,
}

/// Why a client could not use an answer.
#[derive(Debug)]
pub(crate) enum AnswerError {
    /// The daemon speaks another protocol version (0: one from before versions).
    Version(u64),
    /// Not an answer at all.
    Malformed(String),
}

impl Response {
    /// A refusal of class `class`.
    pub fn error(class: ErrorClass, message: impl Into<String>) -> Self {
        Response::Error {
            class,
            message: message.into(),
        }
    }

    /// The answer as one line on the wire (newline included), tagged with
    /// [`PROTOCOL_VERSION`]. A table answer may hold keys, so the line is built in locked
    /// memory and wiped on drop.
    pub fn encode(&self) -> SecretText {
        let (ok, body) = match self {
            Response::Done => (true, WireBody::Done {}),
            Response::Status(s) => (true, WireBody::Status(s)),
            Response::Table(t) => (true, WireBody::Table { table: t.as_str() }),
            Response::Message(r) => (
                true,
                WireBody::Message {
                    reply: r.as_deref(),
                },
            ),
            Response::CloseDeferred { pending } => {
                (true, WireBody::CloseDeferred { pending: *pending })
            }
            Response::Error { class, message } => (
                false,
                WireBody::Error {
                    code: *class as i32,
                    error: message,
                },
            ),
        };
        let wire = WireAnswer {
            v: PROTOCOL_VERSION,
            ok,
            body,
        };
        let mut line = SecretText::new();
        serde_json::to_writer(&mut line, &wire).expect("answers serialise");
        line.push('\n');
        line
    }

    /// The client's side of [`Response::encode`]: the answer to `req` in `line`. A refusal
    /// decodes to [`Response::Error`].
    pub(crate) fn decode(line: &str, req: &Request) -> Result<Response, AnswerError> {
        let value: Value =
            serde_json::from_str(line).map_err(|e| AnswerError::Malformed(e.to_string()))?;
        let head: WireHead = serde_json::from_value(value.clone())
            .map_err(|e| AnswerError::Malformed(e.to_string()))?;
        let version = head.v.unwrap_or(0);
        if version != u64::from(PROTOCOL_VERSION) {
            return Err(AnswerError::Version(version));
        }
        if !head.ok {
            return Ok(Response::Error {
                class: head.code.map_or(ErrorClass::WrongParameters, class_of_code),
                message: head
                    .error
                    .unwrap_or_else(|| "daemon refused the request".to_string()),
            });
        }
        let malformed = |e: serde_json::Error| AnswerError::Malformed(e.to_string());
        Ok(match req {
            Request::Status => {
                Response::Status(Box::new(serde_json::from_value(value).map_err(malformed)?))
            }
            Request::Table { .. } | Request::Refresh { .. } => {
                #[derive(Deserialize)]
                struct TableAnswer {
                    table: String,
                }
                let mut t: TableAnswer = serde_json::from_value(value).map_err(malformed)?;
                let table = SecretText::from_str_copy(&t.table);
                t.table.zeroize();
                Response::Table(table)
            }
            Request::Message { .. } => {
                #[derive(Deserialize)]
                struct MessageAnswer {
                    reply: Option<String>,
                }
                let m: MessageAnswer = serde_json::from_value(value).map_err(malformed)?;
                Response::Message(m.reply)
            }
            Request::CloseDeferred => {
                #[derive(Deserialize)]
                struct DeferredAnswer {
                    pending: bool,
                }
                let d: DeferredAnswer = serde_json::from_value(value).map_err(malformed)?;
                Response::CloseDeferred { pending: d.pending }
            }
            Request::Close
            | Request::CancelDeferredClose
            | Request::Suspend
            | Request::Resume
            | Request::Reload { .. }
            | Request::Reencrypt { .. }
            | Request::DecryptExport { .. }
            | Request::Upgrade { .. } => Response::Done,
        })
    }

    /// The answer as a result: a refusal becomes the [`VolumeError`] it describes.
    pub fn into_result(self) -> Result<Response, VolumeError> {
        match self {
            Response::Error { class, message } => Err(VolumeError::new(class, message)),
            other => Ok(other),
        }
    }
}

/// The class a daemon's `code` names. Unlike [`ErrorClass::from_code`], an unknown code is a
/// usage error: the daemon refused the request itself, the device was never at fault.
fn class_of_code(code: i64) -> ErrorClass {
    match code {
        2 => ErrorClass::NoPermission,
        4 => ErrorClass::WrongDevice,
        5 => ErrorClass::Busy,
        _ => ErrorClass::WrongParameters,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cryptblk_export::ublk::UblkDescription;

    fn status() -> Status {
        Status {
            name: "v".into(),
            info: crate::facts::VolumeFacts {
                cipher: Some("aes-xts-plain64".into()),
                keysize: Some("512 bits".into()),
                ..crate::facts::VolumeFacts::of_kind("LUKS2")
            },
            size: 8 << 20,
            suspended: false,
            inflight: 0,
            held: 0,
            readonly: true,
            table: "0 16384 crypt aes-xts-plain64 - 0 /dev/x 4096\n".into(),
            status: "0 16384 crypt\n".into(),
            pipeline: vec![Pipeline {
                start: 0,
                read: Queueing::Inline,
                write: Queueing::Queued,
                flags: vec!["no_read_workqueue".into()],
            }],
            export: ExportDescription::Ublk(UblkDescription {
                dev: "/dev/ublkb0".into(),
                queues: 2,
                depth: 128,
            }),
            lower: vec!["v_dif".into()],
            pid: 42,
            backings: Vec::new(),
            reencryption: None,
            users: 2,
            deferred_remove: true,
            io: Default::default(),
            targets: Vec::new(),
        }
    }

    #[test]
    fn requests_round_trip_in_their_envelope() {
        let all = [
            Request::Status,
            Request::Table { showkeys: true },
            Request::Table { showkeys: false },
            Request::Close,
            Request::CloseDeferred,
            Request::CancelDeferredClose,
            Request::Suspend,
            Request::Resume,
            Request::Reload {
                table: "0 8 zero\n".into(),
            },
            Request::Refresh {
                flags: vec!["allow_discards".into()],
            },
            Request::Upgrade {
                binary: "/usr/sbin/cryptblk".into(),
            },
        ];
        for r in all {
            let line = r.encode();
            assert!(line.ends_with('\n') && line.matches('\n').count() == 1);
            assert_eq!(Request::decode(&line).unwrap(), r, "{line}");
        }
        assert_eq!(
            Request::Table { showkeys: true }.encode(),
            "{\"v\":1,\"request\":{\"cmd\":\"table\",\"showkeys\":true}}\n"
        );
        assert_eq!(
            Request::Refresh { flags: vec![] }.encode(),
            "{\"v\":1,\"request\":{\"cmd\":\"refresh\",\"flags\":[]}}\n"
        );
        assert_eq!(
            Request::CloseDeferred.encode(),
            "{\"v\":1,\"request\":{\"cmd\":\"close_deferred\"}}\n"
        );
        assert_eq!(
            Request::CancelDeferredClose.encode(),
            "{\"v\":1,\"request\":{\"cmd\":\"cancel_deferred_close\"}}\n"
        );
    }

    #[test]
    fn a_daemon_refuses_requests_of_other_versions_and_malformed_ones() {
        let refusal = |line: &str| match Request::decode(line) {
            Err(Response::Error { class, message }) => {
                assert_eq!(class, ErrorClass::WrongParameters);
                message
            }
            other => panic!("{line} was not refused: {other:?}"),
        };
        // A client from before versions.
        let m = refusal("{\"cmd\":\"close\"}");
        assert!(
            m.contains("speaks control protocol 1, the request is protocol 0"),
            "{m}"
        );
        let m = refusal("{\"v\":2,\"request\":{\"cmd\":\"status\"}}");
        assert!(m.contains("the request is protocol 2"), "{m}");
        let m = refusal("{\"v\":\"one\",\"request\":{\"cmd\":\"status\"}}");
        assert!(m.contains("the request is protocol \"one\""), "{m}");
        assert!(refusal("{\"v\":1,\"request\":{\"cmd\":\"explode\"}}").contains("malformed"));
        assert!(refusal("{\"v\":1,\"request\":{\"cmd\":\"reload\"}}").contains("table"));
        assert!(refusal("not json").contains("malformed request"));
    }

    #[test]
    fn answers_round_trip_for_the_request_they_answer() {
        let s = status();
        let cases = [
            (Request::Status, Response::Status(Box::new(s.clone()))),
            (
                Request::Table { showkeys: false },
                Response::Table("0 8 zero\n".into()),
            ),
            (
                Request::Refresh { flags: vec![] },
                Response::Table("0 8 zero\n".into()),
            ),
            (Request::Close, Response::Done),
            (
                Request::Close,
                Response::error(ErrorClass::Busy, "Device v is still in use."),
            ),
            (
                Request::CloseDeferred,
                Response::CloseDeferred { pending: true },
            ),
            (
                Request::CloseDeferred,
                Response::CloseDeferred { pending: false },
            ),
            (Request::CancelDeferredClose, Response::Done),
            (Request::Resume, Response::Done),
            (
                Request::Suspend,
                Response::error(ErrorClass::Busy, "Device x is still in use (by y)."),
            ),
        ];
        for (req, answer) in cases {
            let line = answer.encode();
            assert!(line.starts_with("{\"v\":1,\"ok\":"), "{}", line.as_str());
            assert_eq!(
                Response::decode(&line, &req).unwrap(),
                answer,
                "{}",
                line.as_str()
            );
        }
        assert_eq!(
            Response::error(ErrorClass::Busy, "busy").encode(),
            "{\"v\":1,\"ok\":false,\"code\":5,\"error\":\"busy\"}\n"
        );
        assert_eq!(Response::Done.encode(), "{\"v\":1,\"ok\":true}\n");
    }

    #[test]
    fn a_client_spots_daemons_of_other_versions() {
        // What a daemon from before versions answers to an envelope: it finds no `cmd`.
        let old = "{\"ok\":false,\"code\":1,\"error\":\"unknown request ''\"}\n";
        assert!(matches!(
            Response::decode(old, &Request::Status),
            Err(AnswerError::Version(0))
        ));
        let newer = "{\"v\":2,\"ok\":true}\n";
        assert!(matches!(
            Response::decode(newer, &Request::Close),
            Err(AnswerError::Version(2))
        ));
        assert!(matches!(
            Response::decode("{\"v\":1,\"ok\":true}\n", &Request::Status),
            Err(AnswerError::Malformed(_))
        ));
    }

    #[test]
    fn status_json_keeps_the_field_order_scripts_read() {
        let v = status().to_json();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "ok",
                "name",
                "info",
                "size",
                "suspended",
                "inflight",
                "readonly",
                "table",
                "status",
                "pipeline",
                "export",
                "lower",
                "pid",
                "users",
                "deferred_remove",
                "io"
            ]
        );
        assert_eq!(
            v["export"].to_string(),
            "{\"kind\":\"ublk\",\"dev\":\"/dev/ublkb0\",\"queues\":2,\"depth\":128}"
        );
        assert_eq!(
            v["pipeline"].to_string(),
            "[{\"start\":0,\"read\":\"inline\",\"write\":\"queued\",\"flags\":[\"no_read_workqueue\"]}]"
        );
        assert_eq!(
            serde_json::to_string(&ExportDescription::None).unwrap(),
            "{\"kind\":\"none\"}"
        );
    }

    #[test]
    fn reload_tables_stay_out_of_debug_output() {
        let r = Request::Reload {
            table: "0 8 crypt aes-xts-plain64 00ff 0 /dev/x 0".into(),
        };
        assert_eq!(format!("{r:?}"), "Reload { .. }");
    }
}
