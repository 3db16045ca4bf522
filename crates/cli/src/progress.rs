//! Progress for long operations (offline encrypt/decrypt, integrity wipes): a bar on a
//! terminal, nothing otherwise, so scripts and `--json` output stay clean.

use indicatif::{ProgressBar, ProgressStyle};

/// A byte-counting bar labelled `what` (a spinner when `total` is unknown); hidden unless
/// `show` and standard error is a terminal.
pub fn bar(total: Option<u64>, what: &str, show: bool) -> ProgressBar {
    if !show || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        return ProgressBar::hidden();
    }
    let pb = match total {
        Some(t) => ProgressBar::new(t),
        None => ProgressBar::new_spinner(),
    };
    pb.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

/// The library's [`cryptblk_volume::Progress`] drawn as [`bar`].
pub struct Bar {
    show: bool,
    bar: Option<ProgressBar>,
}

impl Bar {
    /// A bar shown only if `show` and standard error is a terminal.
    pub fn new(show: bool) -> Self {
        Bar { show, bar: None }
    }
}

impl cryptblk_volume::Progress for Bar {
    fn start(&mut self, total: Option<u64>, what: &str) {
        self.bar = Some(bar(total, what, self.show));
    }
    fn update(&mut self, done: u64) {
        if let Some(b) = &self.bar {
            b.set_position(done);
        }
    }
    fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}
