//! `ls`, `status --format prometheus` and `metrics --listen`: what a monitoring system or
//! an operator reads about every served volume at once.

use crate::actions::serving::device_path;
use crate::exit::{ActionResult, Failure};
use cryptblk_volume::control::{self, Status};
use serde_json::json;

/// The reports of every served volume that answers (lower mappings of a stack included,
/// as `dm ls` lists them). A daemon that goes away between the listing and its question is
/// left out rather than failing the whole report.
fn every_status() -> cryptblk_volume::Result<Vec<Status>> {
    Ok(control::list()?
        .iter()
        .filter_map(|name| control::status(name).ok())
        .collect())
}

/// `status --format prometheus [NAME]`: the exposition of one volume, or of all.
pub fn prometheus(name: Option<&str>) -> ActionResult {
    let volumes = match name {
        Some(n) => vec![control::status(n)?],
        None => every_status()?,
    };
    print!("{}", cryptblk_volume::metrics::prometheus(&volumes));
    Ok(())
}

/// A volume's state word: `active`, `suspended`, or `closing` after `close --deferred`.
fn state(s: &Status) -> &'static str {
    if s.suspended {
        "suspended"
    } else if s.deferred_remove {
        "closing"
    } else {
        "active"
    }
}

/// The pipeline of the first crypt line (`inline/inline`), `-` without one.
fn pipeline(s: &Status) -> String {
    s.pipeline.first().map_or_else(
        || "-".to_string(),
        |p| format!("{}/{}", p.read.as_str(), p.write.as_str()),
    )
}

/// The export's kind (`nbd`, `ublk`, ...), `-` for a lower mapping.
fn export_kind(s: &Status) -> String {
    match s.export_kind() {
        k if k.is_empty() || k == "none" => "-".to_string(),
        k => k,
    }
}

/// `ls [--json]`: one line (or object) per served mapping.
pub fn ls(json_out: bool) -> ActionResult {
    let volumes = every_status()?;
    if json_out {
        let rows: Vec<_> = volumes
            .iter()
            .map(|s| {
                json!({
                    "name": s.name,
                    "export": export_kind(s),
                    "device_path": device_path(&s.name, &s.export),
                    "users": s.users,
                    "pid": s.pid,
                    "state": state(s),
                    "read_pipeline": s.pipeline.first().map(|p| p.read.as_str()),
                    "write_pipeline": s.pipeline.first().map(|p| p.write.as_str()),
                    "size": s.size,
                    "stacked_under": s.info.stacked_under,
                })
            })
            .collect();
        println!("{}", json!({ "volumes": rows }));
        return Ok(());
    }
    let rows: Vec<[String; 7]> = volumes
        .iter()
        .map(|s| {
            [
                s.name.clone(),
                export_kind(s),
                device_path(&s.name, &s.export).unwrap_or_else(|| "-".into()),
                s.users.to_string(),
                s.pid.to_string(),
                state(s).to_string(),
                pipeline(s),
            ]
        })
        .collect();
    let header = [
        "NAME", "EXPORT", "DEVICE", "USERS", "PID", "STATE", "PIPELINE",
    ]
    .map(String::from);
    let mut widths = header.clone().map(|h| h.len());
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    for r in std::iter::once(&header).chain(&rows) {
        let line: Vec<String> = r
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", line.join("  ").trim_end());
    }
    Ok(())
}

/// `metrics --listen ADDR`: answers `GET /metrics` with the exposition of every volume this
/// user serves (each scrape asks the daemons afresh), until the process is killed. Only a
/// loopback address is accepted: the exposition names volumes and their devices, and the
/// runtime directory it reads is private to its owner.
pub fn serve_http(listen: &str) -> ActionResult {
    let addr: std::net::SocketAddr = listen.parse().map_err(|_| {
        Failure::usage(format!(
            "invalid --listen address '{listen}': use 127.0.0.1:PORT or [::1]:PORT"
        ))
    })?;
    if !addr.ip().is_loopback() {
        return Err(Failure::usage(format!(
            "--listen {listen} is not a loopback address: the metrics are served on \
             127.0.0.0/8 or ::1 only"
        )));
    }
    let server = tiny_http::Server::http(addr)
        .map_err(|e| Failure::device(format!("cannot listen on {listen}: {e}")))?;
    let bound = server
        .server_addr()
        .to_ip()
        .map_or_else(|| listen.to_string(), |a| a.to_string());
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "Serving metrics on http://{bound}/metrics");
        let _ = out.flush();
    }
    let text_plain: tiny_http::Header = "Content-Type: text/plain; version=0.0.4; charset=utf-8"
        .parse()
        .expect("a valid header");
    for request in server.incoming_requests() {
        let path = request.url().split('?').next().unwrap_or_default();
        let response = if *request.method() != tiny_http::Method::Get {
            tiny_http::Response::from_string("only GET\n").with_status_code(405)
        } else if path != "/metrics" {
            tiny_http::Response::from_string("not found: try /metrics\n").with_status_code(404)
        } else {
            match every_status() {
                Ok(v) => tiny_http::Response::from_string(cryptblk_volume::metrics::prometheus(&v))
                    .with_header(text_plain.clone()),
                Err(e) => tiny_http::Response::from_string(format!("{e}\n")).with_status_code(500),
            }
        };
        // A scraper that hung up early is its own business.
        let _ = request.respond(response);
    }
    Ok(())
}
