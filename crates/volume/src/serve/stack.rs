//! The stack one daemon serves: the registry with its lower mappings and the top mapping,
//! the export of the top one, and their teardown in order on close.
//!
//! Invariants: every file any table of the stack names is locked before the first table
//! loads, and unlocked only after every mapping was flushed and removed; the handed-over
//! copy of the top table (it holds the key) is wiped as soon as the live table holds it;
//! close tears down top first (devlink, flush, export stop), then each lower mapping from
//! the top down.

use super::export::start_export;
use super::spec::{lower_names, LowerTable, ServeSpec};
use crate::control::Response;
use crate::lock::DataLocks;
use crate::reencrypt::{OnlineJob, OnlineRequest, ReencryptKeys, ReencryptProgress, RunOptions};
use crate::{ErrorClass as ExitCode, VolumeError as Failure};
use cryptblk_dm::backing::FileOptions;
use cryptblk_dm::{BlockDevice, Mapping, Registry, TableSpec};
use cryptblk_export::{Export, ExportDescription};
use std::sync::{Arc, Mutex};

/// True when paths `a` and `b` name the same file.
fn same_file(a: &str, b: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => a == b,
    }
}

/// The mappings and the export of one daemon.
pub(super) struct Stack {
    spec: ServeSpec,
    /// Shared with an online reencryption's thread, which swaps the top table.
    registry: Arc<Registry>,
    /// The top (exported) mapping.
    mapping: Arc<Mapping>,
    /// Replaced by [`cryptblk_export::NoExport`] while an upgrade hands it over.
    export: Mutex<Box<dyn Export>>,
    /// `/dev/cryptblk/NAME` and the ublk device it links to, removed on close.
    dev_link: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// The lower mappings, in creation order.
    lower: Vec<String>,
    /// The data locks on every file the tables use, held until the stack is closed.
    locks: Mutex<DataLocks>,
    /// An online reencryption started on this daemon (running or done).
    reencryption: Mutex<Option<OnlineJob>>,
    /// The header file the volume is served from since an online decryption exported
    /// its header there (`None`: `spec.info.header`, or the device).
    exported_header: Mutex<Option<String>>,
}

impl Stack {
    /// Creates the lower mappings (the keyless ones of `spec.info.lower`, then
    /// `secret_lower`), the top one, and its export.
    /// `before_export` runs once every mapping is loaded (its files locked), just before the
    /// export starts: a successor taking a ublk device over tells its predecessor to exit.
    pub(super) fn build(
        mut spec: ServeSpec,
        secret_lower: Vec<LowerTable>,
        before_export: Option<super::upgrade::TakeOverHook>,
    ) -> Result<Stack, Failure> {
        let lower = lower_names(&spec, &secret_lower);
        // A read-only volume opens every backing O_RDONLY, and its targets load read-only (an
        // integrity target then never writes: no journal replay to disk, no bitmap).
        let registry = Arc::new(Registry::with_file_options(FileOptions {
            read_only: spec.readonly,
            ..FileOptions::default()
        }));
        let mut locks = DataLocks::new();
        {
            // Keyless lower layers (LUKS2 `--integrity`'s `<name>_dif`) travel in the facts,
            // keyed ones only through the pipe; both are created before the top table.
            let tables: Vec<(&str, &str)> = spec
                .info
                .lower
                .iter()
                .map(|l| (l.name.as_str(), l.table.as_str()))
                .chain(
                    secret_lower
                        .iter()
                        .map(|l| (l.name.as_str(), l.table.as_str())),
                )
                .collect();
            // Every file of every table is locked before any table loads (a loading target
            // may already write: integrity's journal replay).
            for table in tables
                .iter()
                .map(|(_, t)| *t)
                .chain(std::iter::once(spec.table.as_str()))
            {
                lock_table_files(&mut locks, table, spec.readonly, &lower)?;
            }
            for (name, table) in tables {
                registry
                    .create(name, table)
                    .map_err(|e| Failure::new(ExitCode::WrongDevice, format!("{name}: {e}")))?;
            }
        }
        drop(secret_lower);
        let mapping = registry.create(&spec.name, &spec.table).map_err(|e| {
            let msg = e.to_string();
            if lower.is_empty() {
                Failure::new(ExitCode::WrongDevice, msg)
            } else {
                Failure::new(ExitCode::WrongDevice, format!("{}: {msg}", spec.name))
            }
        })?;
        // The live table holds the key from here on; the copy we were handed would outlive
        // a `luksSuspend` key wipe.
        zeroize::Zeroize::zeroize(&mut spec.table);
        if let Some(hook) = before_export {
            hook();
        }
        let export = start_export(&spec, mapping.clone())?;
        // The device exists once its export has started: give it its stable name.
        let dev_link = match export.describe() {
            ExportDescription::Ublk(u) => {
                super::devlink::create(&spec.name, &u.dev).map(|link| (link, u.dev))
            }
            _ => None,
        };
        Ok(Stack {
            spec,
            registry,
            mapping,
            export: Mutex::new(export),
            dev_link,
            lower,
            locks: Mutex::new(locks),
            reencryption: Mutex::new(None),
            exported_header: Mutex::new(None),
        })
    }

    /// The reencryption slot, locked, when a new run may start: none runs (exit 5 otherwise)
    /// and the volume is writable (exit 1).
    fn idle_reencryption(&self) -> Result<std::sync::MutexGuard<'_, Option<OnlineJob>>, Failure> {
        let job = self.reencryption.lock().unwrap_or_else(|e| e.into_inner());
        if job.as_ref().is_some_and(|j| j.is_running()) {
            return Err(Failure::new(
                ExitCode::Busy,
                format!("Device {} is already being reencrypted.", self.spec.name),
            ));
        }
        if self.spec.readonly {
            return Err(Failure::usage(format!(
                "Device {} is active read-only; it cannot be reencrypted online.",
                self.spec.name
            )));
        }
        Ok(job)
    }

    /// Starts an online reencryption of the top mapping (see
    /// [`crate::reencrypt::online`]); refused while one runs.
    pub(super) fn start_reencryption(
        &self,
        keys: ReencryptKeys,
        opts: RunOptions,
    ) -> Result<(), Failure> {
        let mut job = self.idle_reencryption()?;
        let device = self.spec.info.device.as_deref();
        let header = self.header();
        let header = header
            .as_deref()
            .or(device)
            .ok_or_else(|| Failure::usage(format!("{} is not a LUKS2 volume", self.spec.name)))?;
        // A detached header: the data is the device the volume was opened on.
        let data = device.filter(|d| !same_file(d, header)).map(Into::into);
        *job = Some(OnlineJob::start(
            self.registry.clone(),
            OnlineRequest {
                name: self.spec.name.clone(),
                header: header.into(),
                data,
                keys,
                opts,
                flags: activation_flags(&self.spec.info),
            },
        )?);
        Ok(())
    }

    /// The header file the volume is served from now: the one an online decryption
    /// exported, else the one it was opened with (`None`: the data device's own).
    pub(super) fn header(&self) -> Option<String> {
        self.exported_header
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .or_else(|| self.spec.info.header.clone())
    }

    /// Starts an online decryption of the top mapping whose header is on its data device,
    /// the header exported to `export` (see
    /// [`crate::reencrypt::online::start_decrypt_export`]); from then on the
    /// volume is served from `export`.
    pub(super) fn start_decrypt_export(
        &self,
        key: cryptblk_cipher::SecretBytes,
        export: &str,
        resilience: crate::reencrypt::DecryptResilience,
        opts: RunOptions,
    ) -> Result<(), Failure> {
        let mut job = self.idle_reencryption()?;
        let device = self
            .spec
            .info
            .device
            .as_deref()
            .ok_or_else(|| Failure::usage(format!("{} has no data device", self.spec.name)))?;
        if self.header().is_some_and(|h| !same_file(&h, device)) {
            return Err(Failure::usage(format!(
                "{} is served from a detached header already.",
                self.spec.name
            )));
        }
        let started = crate::reencrypt::start_decrypt_export(
            self.registry.clone(),
            crate::reencrypt::ExportRequest {
                name: self.spec.name.clone(),
                device: device.into(),
                export: export.into(),
                key,
                resilience,
                opts,
            },
        );
        // Once the reencryption header is in `export`, the volume lives there even when
        // the run failed to start.
        if std::fs::metadata(export).is_ok_and(|m| m.len() > 0) {
            *self
                .exported_header
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some(export.to_string());
        }
        *job = Some(started?);
        Ok(())
    }

    /// True while an online reencryption runs (the table is the reencryption's alone).
    pub(super) fn reencrypting(&self) -> bool {
        self.reencryption
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|j| j.is_running())
    }

    /// The reencryption `status` reports: this daemon's run, else the state the volume
    /// was opened in (`info.reencryption`), else none.
    pub(super) fn reencryption_progress(&self) -> Option<ReencryptProgress> {
        if let Some(j) = self
            .reencryption
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            return Some(j.progress());
        }
        self.spec.info.reencryption.clone()
    }

    /// Stops an online reencryption after its current step (`close`).
    pub(super) fn stop_reencryption(&self) {
        if let Some(j) = self
            .reencryption
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            j.stop();
        }
    }

    /// Locks the files a table about to be loaded into this stack uses (`dm reload`), as
    /// [`Stack::build`] locked the first tables'.
    pub(super) fn lock_files_of(&self, table: &str) -> Result<(), Failure> {
        let mut locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        lock_table_files(&mut locks, table, self.spec.readonly, &self.lower)
    }

    /// What the daemon was started with.
    pub(super) fn spec(&self) -> &ServeSpec {
        &self.spec
    }

    /// The registry holding every mapping of the stack.
    pub(super) fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The lower mappings' names, in creation order.
    pub(super) fn lower(&self) -> &[String] {
        &self.lower
    }

    /// The export, as `status` and READY describe it.
    pub(super) fn export_info(&self) -> ExportDescription {
        self.export().describe()
    }

    fn export(&self) -> std::sync::MutexGuard<'_, Box<dyn Export>> {
        self.export.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A copy of the export's listening socket, for a successor to inherit (see
    /// [`Export::listener`]); `None` when the export has none.
    pub(super) fn export_listener(&self) -> std::io::Result<Option<std::os::fd::OwnedFd>> {
        self.export()
            .listener()
            .map(|fd| fd.try_clone_to_owned())
            .transpose()
    }

    /// Hands the export over for an upgrade ([`Export::hand_over`]): from here no client
    /// reaches the volume through this process.
    pub(super) fn hand_over_export(&self) -> Result<(), Failure> {
        let export = std::mem::replace(&mut *self.export(), Box::new(cryptblk_export::NoExport));
        export
            .hand_over()
            .map_err(|e| Failure::device(format!("cannot hand the export over: {e}")))
    }

    /// Serves again after a failed upgrade: the export restarts on `listener` (the one
    /// handed over, still bound) or binds anew, and the data locks are taken again.
    pub(super) fn resume_after_failed_upgrade(
        &self,
        listener: Option<std::os::fd::OwnedFd>,
    ) -> Result<(), Failure> {
        self.relock()?;
        if let Some(l) = listener {
            cryptblk_export::handover::offer(l);
        }
        let started = start_export(&self.spec, self.mapping.clone());
        cryptblk_export::handover::discard();
        *self.export() = started?;
        Ok(())
    }

    /// True when a successor can take the export over only once this process has exited
    /// (ublk, see [`cryptblk_export::Export::successor_needs_exit`]).
    pub(super) fn successor_needs_exit(&self) -> bool {
        self.export().successor_needs_exit()
    }

    /// Holds new I/O for a hand-over to a successor that takes the export over only once
    /// this process has exited: the top mapping is suspended (requests in flight finish,
    /// new ones wait, as in the kernel's `dmsetup suspend`) and the export announces the
    /// hand-over. The caller has flushed the stack first (a flush would wait here too).
    pub(super) fn hold_for_successor(&self) -> Result<(), Failure> {
        self.mapping
            .suspend()
            .map_err(|e| Failure::device(format!("cannot hold the volume's I/O: {e}")))?;
        if let Err(e) = self.export().prepare_hand_over() {
            let _ = self.mapping.resume();
            return Err(Failure::device(format!("cannot hand the export over: {e}")));
        }
        Ok(())
    }

    /// Undoes [`Stack::hold_for_successor`] after the successor failed before taking over:
    /// the data locks are taken again, the hand-over withdrawn and the held I/O released.
    pub(super) fn resume_after_failed_take_over(&self) -> Result<(), Failure> {
        self.export().cancel_hand_over();
        let locked = self.relock();
        // Even without the locks the I/O is released: this process is the one serving.
        let resumed = self
            .mapping
            .resume()
            .map(drop)
            .map_err(|e| Failure::device(format!("cannot release the volume's I/O: {e}")));
        locked.and(resumed)
    }

    /// Takes the data locks of every mapping again (after a failed upgrade).
    fn relock(&self) -> Result<(), Failure> {
        let mut locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        for name in self.registry.list() {
            if let Some(m) = self.registry.lookup(&name) {
                lock_table_files(
                    &mut locks,
                    m.table(false).as_str(),
                    self.spec.readonly,
                    &self.lower,
                )?;
            }
        }
        Ok(())
    }

    /// Gives up the data locks so that a successor process can take them (an upgrade);
    /// [`Stack::resume_after_failed_upgrade`] takes them again.
    pub(super) fn release_locks(&self) {
        drop(std::mem::take(
            &mut *self.locks.lock().unwrap_or_else(|e| e.into_inner()),
        ));
    }

    /// Flushes every mapping of the stack, top first.
    pub(super) fn flush_all(&self) -> Result<(), Failure> {
        let names = std::iter::once(self.spec.name.clone()).chain(self.lower.iter().rev().cloned());
        for name in names {
            if let Some(m) = self.registry.lookup(&name) {
                m.flush()
                    .map_err(|e| Failure::device(format!("flush of {name} failed: {e}")))?;
            }
        }
        Ok(())
    }

    /// What a successor serves to take this stack over: the live top table and the keyed
    /// lower tables (keys included), the same export and facts (with the header an online
    /// decryption exported, if any).
    pub(super) fn successor_spec(&self) -> (ServeSpec, Vec<LowerTable>) {
        let keyless: Vec<&String> = self.spec.info.lower.iter().map(|l| &l.name).collect();
        let lower = self
            .lower
            .iter()
            .filter(|n| !keyless.contains(n))
            .filter_map(|n| {
                let m = self.registry.lookup(n)?;
                Some(LowerTable {
                    name: n.clone(),
                    table: m.table(true).as_str().to_string(),
                })
            })
            .collect();
        let mut info = self.spec.info.clone();
        if let Some(h) = self
            .exported_header
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        {
            info.header = Some(h);
        }
        let spec = ServeSpec {
            name: self.spec.name.clone(),
            table: self.mapping.table(true).as_str().to_string(),
            export: self.spec.export.clone(),
            readonly: self.spec.readonly,
            info,
        };
        (spec, lower)
    }

    /// True if any mapping of the stack is suspended.
    pub(super) fn any_suspended(&self) -> bool {
        self.registry
            .list()
            .iter()
            .any(|n| self.registry.lookup(n).is_some_and(|m| m.info().suspended))
    }

    /// Users of the export now (see [`Export::users`]): `close` refuses while not 0.
    pub(super) fn users(&self) -> usize {
        self.export().users()
    }

    /// Tells the export's clients the top mapping's new size (after a resume swapped in a
    /// table of another length).
    pub(super) fn export_resized(&self, new_size: u64) -> Result<(), String> {
        self.export().resized(new_size).map_err(|e| {
            format!(
                "{} now has {new_size} bytes, but its export could not tell its clients: {e}",
                self.spec.name
            )
        })
    }

    /// `dm remove` of a lower mapping: refused while another mapping of the stack uses it in
    /// its live or staged table (the kernel's EBUSY), or while suspended (its flush would
    /// wait for a resume that the control loop must answer), else flushed and removed.
    pub(super) fn remove_lower(&self, name: &str) -> Response {
        let registry = &self.registry;
        let users: Vec<String> = registry
            .list()
            .into_iter()
            .filter(|other| {
                other != name
                    && registry.lookup(other).is_some_and(|m| {
                        names_device(&m.table(false), name)
                            || m.staged_table(false)
                                .is_some_and(|t| names_device(&t, name))
                    })
            })
            .collect();
        if !users.is_empty() {
            return Response::error(
                ExitCode::Busy,
                format!("Device {name} is still in use (by {}).", users.join(", ")),
            );
        }
        if let Some(m) = registry.lookup(name) {
            if m.info().suspended {
                return Response::error(
                    ExitCode::Busy,
                    format!("Device {name} is suspended; resume it before removing it."),
                );
            }
            if let Err(e) = m.flush() {
                return Response::error(
                    ExitCode::WrongDevice,
                    format!("flush of {name} failed: {e}"),
                );
            }
        }
        match registry.remove(name) {
            Ok(()) => Response::Done,
            Err(cryptblk_dm::DmError::Busy(_, why)) => Response::error(
                ExitCode::Busy,
                format!("Device {name} is still in use ({why})."),
            ),
            Err(e) => Response::error(ExitCode::WrongDevice, e.to_string()),
        }
    }

    /// Gives up before serving (the control sockets could not be bound): stops the export.
    pub(super) fn abandon(self) {
        if let Some((link, dev)) = &self.dev_link {
            super::devlink::remove(link, dev);
        }
        let _ = self
            .export
            .into_inner()
            .unwrap_or_else(|e| e.into_inner())
            .stop();
    }

    /// Gives up before serving a ublk device taken over from a predecessor: the device is
    /// handed over (left for the next `open` to take over) rather than deleted.
    pub(super) fn leave_for_recovery(self) {
        let export = self.export.into_inner().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = export.hand_over() {
            log::warn!("{}: {e}", self.spec.name);
        }
    }

    /// Ends the stack in order: flush the top mapping, stop the export, remove the top
    /// mapping, then each lower one from the top down (flushed first). Errors of the top's
    /// flush and of the export's stop are reported after everything was torn down.
    pub(super) fn close(self) -> Result<(), Failure> {
        let Stack {
            spec,
            registry,
            mapping,
            export,
            dev_link,
            lower,
            locks,
            reencryption,
            exported_header: _,
        } = self;
        // The stable name goes first: nothing should open the device while it stops.
        if let Some((link, dev)) = &dev_link {
            super::devlink::remove(link, dev);
        }
        // Its thread holds the registry and may hold the hotzone: end it first.
        drop(reencryption);
        // A suspended mapping's I/O would wait for a resume that never comes: it is removed
        // as the kernel removes a suspended device (its backing flushed directly).
        let flushed = if mapping.info().suspended {
            mapping.remove_suspended()
        } else {
            mapping.flush()
        };
        let stopped = export
            .into_inner()
            .unwrap_or_else(|e| e.into_inner())
            .stop();
        drop(mapping);
        let _ = registry.remove(&spec.name);
        for name in lower.iter().rev() {
            if let Some(m) = registry.lookup(name) {
                let _ = m.flush();
            }
            let _ = registry.remove(name);
        }
        drop(registry);
        // Only now, with every backing flushed and closed, may another writer come in.
        drop(locks);
        flushed.map_err(|e| Failure::device(format!("flush on close failed: {e}")))?;
        stopped.map_err(|e| Failure::device(e.to_string()))?;
        Ok(())
    }
}

/// Adds to `locks` every file `table` names (exclusive unless `read_only`); names of the
/// stack's own mappings (`lower`) and RAM disks are no files. An unparsable table is left to
/// the load, which reports it.
fn lock_table_files(
    locks: &mut DataLocks,
    table: &str,
    read_only: bool,
    lower: &[String],
) -> Result<(), Failure> {
    let Ok(spec) = TableSpec::parse(table) else {
        return Ok(());
    };
    locks.add_devices(
        spec.lines.iter().flat_map(|l| l.target.devices()),
        !read_only,
        |name| lower.iter().any(|l| l == name),
    )
}

/// True if `table` names device `name` (as `name` or `/dev/mapper/name`).
fn names_device(table: &str, name: &str) -> bool {
    TableSpec::parse(table).is_ok_and(|t| t.names_device(name))
}

/// The activation flags `open` recorded for a volume served mid-reencryption (see
/// [`crate::facts::VolumeFacts::activation_flags`]), `None` when it recorded none.
fn activation_flags(info: &crate::facts::VolumeFacts) -> Option<cryptblk_dm::CryptFlags> {
    cryptblk_dm::CryptFlags::parse(info.activation_flags.as_ref()?).ok()
}
