//! A live mapping: the device `dmsetup create` makes, with reload + suspend/resume.
//!
//! I/O enters through the active table. `reload` stages a new table without touching I/O;
//! `suspend` stops new I/O from entering (callers wait, they do not fail) and returns once
//! every in-flight request has finished; `resume` swaps in the staged table, if any, and lets
//! the waiters through. That is the sequence the kernel runs for `dmsetup reload` +
//! `dmsetup suspend` + `dmsetup resume`, which lets crypt flags change under load. The
//! targets take part through their [`Target`] hooks (suspend and resume in the kernel's
//! order, `message` routed by sector), never by downcasting.

use cryptblk_cipher::SecretText;
use std::io;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use crate::device::{BlockDevice, WriteFlags};
use crate::error::DmError;
use crate::io_stats::{errno_name, Direction, ErrorLog, IoStats, IoStatsSnapshot};
use crate::table::Table;
use crate::targets::{Target, TargetStats};

/// A loaded table plus the mapping names it stacks on (for cycle and busy checks).
pub(crate) struct LoadedTable {
    pub(crate) table: Table,
    pub(crate) deps: Vec<String>,
}

struct MapState {
    active: Arc<LoadedTable>,
    staged: Option<Arc<LoadedTable>>,
    suspended: bool,
    inflight: usize,
    /// Requests waiting for a suspended mapping to resume (held I/O).
    held: usize,
    /// Set by [`Mapping::remove_suspended`]: held and new requests fail instead of waiting.
    removed: bool,
    /// Request statistics for the mapping's whole life (see [`crate::io_stats`]).
    io: IoStats,
}

/// `dmsetup info`-like facts about a mapping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MappingInfo {
    /// Mapping name.
    pub name: String,
    /// Size of the live table in bytes.
    pub size: u64,
    /// True while suspended.
    pub suspended: bool,
    /// True if a table is staged by `reload` and waits for `resume`.
    pub inactive_table: bool,
    /// Requests in flight right now.
    pub inflight: usize,
    /// Requests held while the mapping is suspended (they run on resume).
    pub held: usize,
    /// Number of targets in the live table.
    pub targets: usize,
}

/// A named, live device-mapper device.
pub struct Mapping {
    name: String,
    state: Mutex<MapState>,
    changed: Condvar,
}

/// Keeps a request counted as in flight until dropped; [`InFlight::finish`] records its
/// outcome in the mapping's statistics on the way out (under the same lock acquisition).
struct InFlight<'a> {
    mapping: &'a Mapping,
    loaded: Arc<LoadedTable>,
    started: Instant,
    outcome: Option<Outcome>,
}

/// What a finished request did, for the statistics and the error log.
struct Outcome {
    dir: Direction,
    offset: u64,
    len: u64,
    error: Option<String>,
}

impl InFlight<'_> {
    /// Notes the result of the request; recorded when the guard drops.
    fn finish<T>(
        mut self,
        dir: Direction,
        offset: u64,
        len: u64,
        r: io::Result<T>,
    ) -> io::Result<T> {
        self.outcome = Some(Outcome {
            dir,
            offset,
            len,
            error: r.as_ref().err().map(errno_name),
        });
        r
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let elapsed = self.started.elapsed();
        let mut s = self.mapping.lock();
        s.inflight -= 1;
        if s.inflight == 0 && s.suspended {
            self.mapping.changed.notify_all();
        }
        let Some(o) = self.outcome.take() else {
            return;
        };
        s.io.record(o.dir, o.len, elapsed, o.error.is_none());
        let Some(errno) = o.error else {
            return;
        };
        let log = s.io.error_log(Instant::now());
        drop(s);
        // The kernel's "I/O error, dev dm-0, sector N op 0x0:(READ)": which mapping, which
        // sector (512-byte units, as dmsetup and the kernel count), how long, which errno.
        if let ErrorLog::Log { suppressed } = log {
            if suppressed > 0 {
                log::warn!(
                    "{}: {suppressed} more I/O errors not logged",
                    self.mapping.name
                );
            }
            log::error!(
                "{}: I/O error, {} at sector {} ({} bytes): {errno}",
                self.mapping.name,
                o.dir.as_str(),
                o.offset / 512,
                o.len
            );
        }
    }
}

impl Mapping {
    /// A mapping named `name` serving `table`. Most callers go through
    /// [`crate::Registry::create`], which also resolves device names.
    pub fn new(name: &str, table: Table) -> Mapping {
        Self::with_loaded(
            name,
            LoadedTable {
                table,
                deps: Vec::new(),
            },
        )
    }

    pub(crate) fn with_loaded(name: &str, loaded: LoadedTable) -> Mapping {
        Mapping {
            name: name.to_string(),
            state: Mutex::new(MapState {
                active: Arc::new(loaded),
                staged: None,
                suspended: false,
                inflight: 0,
                held: 0,
                removed: false,
                io: IoStats::default(),
            }),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, MapState> {
        // The state is a few counters and Arcs updated atomically under the lock; a panic
        // elsewhere cannot leave it half-written.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The mapping's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Counts a request in flight, first waiting while the mapping is suspended. Fails with
    /// ENXIO once the mapping was removed while suspended (the kernel's removed device).
    fn enter(&self) -> io::Result<InFlight<'_>> {
        let mut s = self.lock();
        while s.suspended && !s.removed {
            s.held += 1;
            s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
            s.held -= 1;
        }
        if s.removed {
            return Err(io::Error::from_raw_os_error(libc::ENXIO));
        }
        s.inflight += 1;
        Ok(InFlight {
            mapping: self,
            loaded: s.active.clone(),
            started: Instant::now(),
            outcome: None,
        })
    }

    /// Ends a suspended mapping for good, as the kernel removes a suspended device: requests
    /// held by the suspend (and any that arrive later) fail with ENXIO instead of waiting
    /// for a resume that will never come, and the live table's backing is flushed directly
    /// (nothing is in flight on a suspended mapping, so the flush races no write). Callers
    /// refuse the removal while [`MappingInfo::held`] is nonzero, as the kernel refuses to
    /// remove an open device; this is the safety net for requests that raced that check.
    pub fn remove_suspended(&self) -> io::Result<()> {
        let live = {
            let mut s = self.lock();
            s.removed = true;
            self.changed.notify_all();
            s.active.clone()
        };
        live.table.flush()
    }

    /// Stages `table` to replace the live one at the next [`Mapping::resume`]; I/O is not
    /// affected. A second reload replaces the staged table.
    pub fn reload(&self, table: Table) {
        self.stage(LoadedTable {
            table,
            deps: Vec::new(),
        });
    }

    pub(crate) fn stage(&self, loaded: LoadedTable) {
        let old = self.lock().staged.replace(Arc::new(loaded));
        drop(old);
    }

    /// Drops a staged table (`dmsetup clear`).
    pub fn clear_staged(&self) {
        let old = self.lock().staged.take();
        drop(old);
    }

    /// Stops new I/O (it waits, it does not fail) and waits for in-flight I/O to finish,
    /// calling the live table's [`Target::presuspend`] hooks before the wait and its
    /// [`Target::postsuspend`] hooks after it, as the kernel's `dm_suspend` does.
    /// Idempotent: suspending a suspended mapping calls no hooks.
    ///
    /// The mapping is suspended even when a hook fails; the first failure is returned.
    pub fn suspend(&self) -> Result<(), DmError> {
        let table = {
            let s = self.lock();
            if s.suspended {
                return Ok(());
            }
            s.active.clone()
        };
        let mut result = self.each_target(&table, "presuspend", |t| t.presuspend());
        {
            let mut s = self.lock();
            s.suspended = true;
            while s.inflight > 0 {
                s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
            }
        }
        let post = self.each_target(&table, "postsuspend", |t| t.postsuspend());
        if result.is_ok() {
            result = post;
        }
        result
    }

    /// Calls `hook` on every target of `table` in order; all run, the first error is kept.
    fn each_target(
        &self,
        table: &LoadedTable,
        what: &str,
        hook: impl Fn(&dyn Target) -> io::Result<()>,
    ) -> Result<(), DmError> {
        let mut result = Ok(());
        for e in table.table.entries() {
            if let Err(err) = hook(e.target.as_ref()) {
                if result.is_ok() {
                    result = Err(DmError::State {
                        name: self.name.clone(),
                        msg: format!(
                            "{} target at sector {}: {what} failed: {err}",
                            e.target.target_type(),
                            e.start
                        ),
                    });
                }
            }
        }
        result
    }

    /// Swaps in the staged table, if any, and releases waiting I/O. Returns true if the
    /// table changed.
    ///
    /// As in the kernel, a staged table only goes live on a suspended device, so a live
    /// mapping with a staged table is suspended first. The table that is live afterwards
    /// gets [`Target::preresume`] then [`Target::resume`]; if a `preresume` fails the
    /// mapping stays suspended (I/O keeps waiting) with that table live, and the error is
    /// returned.
    pub fn resume(&self) -> Result<bool, DmError> {
        let has_staged = {
            let s = self.lock();
            if !s.suspended && s.staged.is_none() {
                return Ok(false);
            }
            s.staged.is_some()
        };
        if has_staged {
            self.suspend()?;
        }
        let (old, live) = {
            let mut s = self.lock();
            let old = s
                .staged
                .take()
                .map(|new| std::mem::replace(&mut s.active, new));
            (old, s.active.clone())
        };
        let changed = old.is_some();
        // Dropping a table may stop pipeline threads; do it outside the lock.
        drop(old);
        self.each_target(&live, "preresume", |t| t.preresume())?;
        for e in live.table.entries() {
            e.target.resume();
        }
        {
            let mut s = self.lock();
            s.suspended = false;
            self.changed.notify_all();
        }
        Ok(changed)
    }

    /// Reload + suspend + resume in one call: replaces the live table with no failed I/O.
    pub fn replace_table(&self, table: Table) -> Result<(), DmError> {
        self.reload(table);
        self.suspend()?;
        self.resume().map(|_| ())
    }

    /// `dmsetup message <name> <sector> <argv...>`: hands `argv` to the live table's target
    /// that covers `sector` (see [`Target::message`]); `Ok(Some(text))` is its reply.
    pub fn message(&self, sector: u64, argv: &[&str]) -> Result<Option<String>, DmError> {
        let loaded = self.lock().active.clone();
        let entry = loaded
            .table
            .entries()
            .iter()
            .find(|e| sector >= e.start && sector - e.start < e.len)
            .ok_or_else(|| DmError::State {
                name: self.name.clone(),
                msg: format!("no target covers sector {sector}"),
            })?;
        if argv.is_empty() {
            return Err(DmError::State {
                name: self.name.clone(),
                msg: "empty message".into(),
            });
        }
        entry.target.message(argv).map_err(|msg| DmError::State {
            name: self.name.clone(),
            msg: format!("{} target: {msg}", entry.target.target_type()),
        })
    }

    /// Counters and facts of every target in the live table that reports any, in table
    /// order (see [`Target::stats`]).
    pub fn stats(&self) -> Vec<TargetStats> {
        self.with_table(|t| {
            t.entries()
                .iter()
                .map(|e| e.target.stats())
                .filter(|st| !st.is_empty())
                .collect()
        })
    }

    /// The live table as `dmsetup table [--showkeys]` prints it (locked text, wiped on drop:
    /// with `show_keys` it holds keys).
    pub fn table(&self, show_keys: bool) -> SecretText {
        self.lock().active.table.format(show_keys)
    }

    /// The staged table, if any, as `dmsetup table --inactive` prints it.
    pub fn staged_table(&self, show_keys: bool) -> Option<SecretText> {
        self.lock()
            .staged
            .as_ref()
            .map(|t| t.table.format(show_keys))
    }

    /// The live table's `dmsetup status`.
    pub fn status(&self) -> String {
        let loaded = self.lock().active.clone();
        loaded.table.status()
    }

    /// Runs `f` on the live table (tests reach a concrete target through
    /// [`crate::Target::as_any`]).
    pub fn with_table<R>(&self, f: impl FnOnce(&Table) -> R) -> R {
        let loaded = self.lock().active.clone();
        f(&loaded.table)
    }

    /// Request counts, bytes, errors and latency quantiles per direction since the mapping
    /// was created (monotonic across reload and resume; see [`crate::io_stats`]).
    pub fn io_stats(&self) -> IoStatsSnapshot {
        self.lock().io.snapshot()
    }

    /// `dmsetup info`.
    pub fn info(&self) -> MappingInfo {
        let s = self.lock();
        MappingInfo {
            name: self.name.clone(),
            size: s.active.table.size(),
            suspended: s.suspended,
            inactive_table: s.staged.is_some(),
            inflight: s.inflight,
            held: s.held,
            targets: s.active.table.entries().len(),
        }
    }

    /// Mapping names the live and staged tables stack on.
    pub(crate) fn deps(&self) -> Vec<String> {
        let s = self.lock();
        let mut d = s.active.deps.clone();
        if let Some(st) = &s.staged {
            d.extend(st.deps.iter().cloned());
        }
        d
    }

    /// Fails with a state error if suspended (for operations that need a live device).
    pub fn ensure_live(&self) -> Result<(), DmError> {
        if self.lock().suspended {
            return Err(DmError::State {
                name: self.name.clone(),
                msg: "device is suspended".into(),
            });
        }
        Ok(())
    }
}

impl BlockDevice for Mapping {
    fn size(&self) -> u64 {
        self.lock().active.table.size()
    }
    fn logical_block_size(&self) -> u32 {
        self.lock().active.table.logical_block_size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let g = self.enter()?;
        let r = g.loaded.table.read_at(offset, buf);
        g.finish(Direction::Read, offset, buf.len() as u64, r)
    }
    fn write_at(&self, offset: u64, buf: &[u8], flags: WriteFlags) -> io::Result<()> {
        let g = self.enter()?;
        let r = g.loaded.table.write_at(offset, buf, flags);
        g.finish(Direction::Write, offset, buf.len() as u64, r)
    }
    fn write_at_scratch(&self, offset: u64, buf: &mut [u8], flags: WriteFlags) -> io::Result<()> {
        let g = self.enter()?;
        let r = g.loaded.table.write_at_scratch(offset, buf, flags);
        g.finish(Direction::Write, offset, buf.len() as u64, r)
    }
    fn flush(&self) -> io::Result<()> {
        let g = self.enter()?;
        let r = g.loaded.table.flush();
        g.finish(Direction::Flush, 0, 0, r)
    }
    fn tag_size(&self) -> u32 {
        let loaded = self.lock().active.clone();
        tagged_target(&loaded.table, 0, loaded.table.size()).map_or(0, |(t, _)| t.tag_size())
    }
    fn read_with_tags(&self, offset: u64, buf: &mut [u8], tags: &mut [u8]) -> io::Result<()> {
        let g = self.enter()?;
        let r = match tagged_target(&g.loaded.table, offset, buf.len() as u64) {
            Some((t, off)) => t.read_with_tags(off, buf, tags),
            None => Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP)),
        };
        g.finish(Direction::Read, offset, buf.len() as u64, r)
    }
    fn write_with_tags(
        &self,
        offset: u64,
        buf: &[u8],
        tags: &[u8],
        flags: WriteFlags,
    ) -> io::Result<()> {
        let g = self.enter()?;
        let r = match tagged_target(&g.loaded.table, offset, buf.len() as u64) {
            Some((t, off)) => t.write_with_tags(off, buf, tags, flags),
            None => Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP)),
        };
        g.finish(Direction::Write, offset, buf.len() as u64, r)
    }
    fn supports_discard(&self) -> bool {
        self.lock().active.table.supports_discard()
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        let g = self.enter()?;
        let r = g.loaded.table.discard(offset, len);
        g.finish(Direction::Discard, offset, len, r)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        let g = self.enter()?;
        let r = g.loaded.table.write_zeroes(offset, len);
        g.finish(Direction::Discard, offset, len, r)
    }
}

/// The single target holding bytes `offset..offset+len` of `table`, with the offset
/// relative to it. Tagged I/O is passed through only within one target (the kernel's
/// integrity profile is per device, and cryptsetup's integrity tables have one line).
fn tagged_target(
    table: &crate::table::Table,
    offset: u64,
    len: u64,
) -> Option<(&Arc<dyn Target>, u64)> {
    use crate::SECTOR_SIZE;
    table.entries().iter().find_map(|e| {
        let start = e.start * SECTOR_SIZE;
        let end = start + e.len * SECTOR_SIZE;
        (offset >= start && offset + len <= end).then(|| (&e.target, offset - start))
    })
}
