//! The registry of named mappings, and device resolution for tables.
//!
//! A device in a table is `ram:<size>[#<tag>]`, a remote store (`rbd:pool/image[@snap]`, see
//! [`crate::backing::open_remote`]; NBD URIs `nbd://`, `nbds://`, `nbd+unix://`, see
//! [`crate::backing::nbd`]), the name of another mapping (also as
//! `/dev/mapper/<name>`), or a path to a file or block device. The same spec resolves to the
//! same open device while anything still uses it, as a device node names one device in the
//! kernel: reloading a table over `ram:1G` keeps the RAM disk's contents. Add `#<tag>` to get
//! distinct RAM disks of the same size.

use crate::device::SECTOR_SIZE;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock, Weak};

use crate::backing::{parse_size, FileBacking, FileOptions, RamDisk};
use crate::device::BlockDevice;
use crate::error::DmError;
use crate::mapping::{LoadedTable, Mapping};
use crate::resolver::{DeviceResolver, LoadOptions};
use crate::table::Table;

/// Named mappings plus the devices they use.
pub struct Registry {
    mappings: RwLock<BTreeMap<String, Arc<Mapping>>>,
    open: Mutex<HashMap<String, Weak<dyn BlockDevice>>>,
    file_options: FileOptions,
    cipher_implementation: RwLock<Option<String>>,
}

impl Default for Registry {
    fn default() -> Self {
        Self::new()
    }
}

/// Resolver used while loading a table for mapping `target_name`: records the mappings used
/// and refuses ones that would make a cycle.
struct LoadResolver<'a> {
    registry: &'a Registry,
    target_name: Option<&'a str>,
    deps: Mutex<Vec<String>>,
}

impl DeviceResolver for LoadResolver<'_> {
    fn open_device(&self, spec: &str) -> Result<Arc<dyn BlockDevice>, DmError> {
        if let Some(name) = self.registry.mapping_name_of(spec) {
            if let Some(own) = self.target_name {
                if self.registry.depends_on(&name, own) {
                    return Err(DmError::Device {
                        spec: spec.to_string(),
                        source: std::io::Error::new(
                            std::io::ErrorKind::InvalidInput,
                            format!("stacking on '{name}' would make '{own}' depend on itself"),
                        ),
                    });
                }
            }
            let m = self
                .registry
                .lookup(&name)
                .ok_or(DmError::NoSuchMapping(name.clone()))?;
            self.deps
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(name);
            return Ok(m);
        }
        self.registry.open_device(spec)
    }
}

impl Registry {
    /// An empty registry; files open buffered and read-write.
    pub fn new() -> Self {
        Self::with_file_options(FileOptions::default())
    }

    /// An empty registry whose file backings open with `options` (e.g. `O_DIRECT`).
    pub fn with_file_options(options: FileOptions) -> Self {
        Registry {
            mappings: RwLock::new(BTreeMap::new()),
            open: Mutex::new(HashMap::new()),
            file_options: options,
            cipher_implementation: RwLock::new(None),
        }
    }

    /// Makes crypt targets loaded from now on use cipher implementation `name` (as listed by
    /// `cryptblk ciphers`); `None` restores the default (fastest available).
    pub fn set_cipher_implementation(&self, name: Option<&str>) {
        *self
            .cipher_implementation
            .write()
            .unwrap_or_else(|e| e.into_inner()) = name.map(str::to_string);
    }

    /// The cipher implementation crypt targets are built with (`None` = default).
    pub fn cipher_implementation(&self) -> Option<String> {
        self.cipher_implementation
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The settings tables are loaded with: read-only with the registry's files, and the
    /// cipher implementation chosen by [`Registry::set_cipher_implementation`].
    pub fn load_options(&self) -> LoadOptions {
        LoadOptions {
            read_only: self.file_options.read_only,
            cipher_implementation: self.cipher_implementation(),
        }
    }

    /// If `spec` names a mapping (`name` or `/dev/mapper/name`), returns the name.
    fn mapping_name_of(&self, spec: &str) -> Option<String> {
        let name = spec.strip_prefix("/dev/mapper/").unwrap_or(spec);
        if name.contains('/') || name.starts_with("ram:") {
            return None;
        }
        self.mappings
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(name)
            .then(|| name.to_string())
    }

    /// True if mapping `from` is `to` or stacks (transitively) on it.
    fn depends_on(&self, from: &str, to: &str) -> bool {
        let mut stack = vec![from.to_string()];
        let mut seen = std::collections::HashSet::new();
        while let Some(n) = stack.pop() {
            if n == to {
                return true;
            }
            if !seen.insert(n.clone()) {
                continue;
            }
            if let Some(m) = self.lookup(&n) {
                stack.extend(m.deps());
            }
        }
        false
    }

    fn load(&self, name: Option<&str>, table_text: &str) -> Result<LoadedTable, DmError> {
        let resolver = LoadResolver {
            registry: self,
            target_name: name,
            deps: Mutex::new(Vec::new()),
        };
        let table = Table::load_with(table_text, &resolver, &self.load_options())?;
        let deps = resolver
            .deps
            .into_inner()
            .unwrap_or_else(|e| e.into_inner());
        Ok(LoadedTable { table, deps })
    }

    /// Loads a table without registering it (to serve it directly or inspect it).
    pub fn load_table(&self, table_text: &str) -> Result<Table, DmError> {
        Ok(self.load(None, table_text)?.table)
    }

    /// `dmsetup create <name> --table <text>`: builds the table and registers the mapping.
    pub fn create(&self, name: &str, table_text: &str) -> Result<Arc<Mapping>, DmError> {
        validate_name(name)?;
        if self.lookup(name).is_some() {
            return Err(DmError::MappingExists(name.to_string()));
        }
        let loaded = self.load(Some(name), table_text)?;
        let mapping = Arc::new(Mapping::with_loaded(name, loaded));
        let mut maps = self.mappings.write().unwrap_or_else(|e| e.into_inner());
        if maps.contains_key(name) {
            return Err(DmError::MappingExists(name.to_string()));
        }
        maps.insert(name.to_string(), mapping.clone());
        Ok(mapping)
    }

    /// Registers a mapping around a table built in code (e.g. a crypt target made with
    /// [`crate::CryptTarget::new`] so the key never exists as hex text). Mappings it stacks
    /// on must be listed in `deps` for busy and cycle checks.
    pub fn create_with_table(
        &self,
        name: &str,
        table: Table,
        deps: &[&str],
    ) -> Result<Arc<Mapping>, DmError> {
        validate_name(name)?;
        let loaded = LoadedTable {
            table,
            deps: deps.iter().map(|d| d.to_string()).collect(),
        };
        let mapping = Arc::new(Mapping::with_loaded(name, loaded));
        let mut maps = self.mappings.write().unwrap_or_else(|e| e.into_inner());
        if maps.contains_key(name) {
            return Err(DmError::MappingExists(name.to_string()));
        }
        maps.insert(name.to_string(), mapping.clone());
        Ok(mapping)
    }

    /// `dmsetup reload <name>`: builds and stages a new table; takes effect at resume.
    pub fn reload(&self, name: &str, table_text: &str) -> Result<(), DmError> {
        let mapping = self.get(name)?;
        let loaded = self.load(Some(name), table_text)?;
        mapping.stage(loaded);
        Ok(())
    }

    /// `dmsetup suspend <name>`.
    pub fn suspend(&self, name: &str) -> Result<(), DmError> {
        self.get(name)?.suspend()
    }

    /// `dmsetup resume <name>`; returns true if a staged table went live.
    pub fn resume(&self, name: &str) -> Result<bool, DmError> {
        self.get(name)?.resume()
    }

    /// Reload + suspend + resume: what `cryptsetup refresh` does to change crypt flags.
    pub fn replace_table(&self, name: &str, table_text: &str) -> Result<(), DmError> {
        self.reload(name, table_text)?;
        let m = self.get(name)?;
        m.suspend()?;
        m.resume().map(|_| ())
    }

    /// `dmsetup remove <name>`: fails with [`DmError::Busy`] while another mapping stacks on
    /// it or anyone else holds it open.
    pub fn remove(&self, name: &str) -> Result<(), DmError> {
        let users: Vec<String> = self
            .list()
            .into_iter()
            .filter(|other| other != name)
            .filter(|other| {
                self.lookup(other)
                    .is_some_and(|m| m.deps().iter().any(|d| d == name))
            })
            .collect();
        if !users.is_empty() {
            return Err(DmError::Busy(
                name.to_string(),
                format!("used by {}", users.join(", ")),
            ));
        }
        let mut maps = self.mappings.write().unwrap_or_else(|e| e.into_inner());
        let m = maps
            .get(name)
            .ok_or_else(|| DmError::NoSuchMapping(name.to_string()))?;
        let holders = Arc::strong_count(m) - 1;
        if holders > 0 {
            return Err(DmError::Busy(
                name.to_string(),
                format!("open by {holders} other user(s)"),
            ));
        }
        maps.remove(name);
        Ok(())
    }

    /// The mapping called `name`.
    pub fn lookup(&self, name: &str) -> Option<Arc<Mapping>> {
        self.mappings
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
    }

    /// Like [`Registry::lookup`], as a `Result`.
    pub fn get(&self, name: &str) -> Result<Arc<Mapping>, DmError> {
        self.lookup(name)
            .ok_or_else(|| DmError::NoSuchMapping(name.to_string()))
    }

    /// Names of all mappings, sorted (`dmsetup ls`).
    pub fn list(&self) -> Vec<String> {
        self.mappings
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    /// The open backings that count their failures ([`BlockDevice::backing_errors`]: remote
    /// stores) as (spec, failed requests), sorted by spec.
    pub fn backing_errors(&self) -> Vec<(String, u64)> {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<(String, u64)> = open
            .iter()
            .filter_map(|(spec, dev)| Some((spec.clone(), dev.upgrade()?.backing_errors()?)))
            .collect();
        out.sort();
        out
    }

    /// Opens a backing or mapping by spec (see the module docs).
    pub fn open_device(&self, spec: &str) -> Result<Arc<dyn BlockDevice>, DmError> {
        if let Some(name) = self.mapping_name_of(spec) {
            if let Some(m) = self.lookup(&name) {
                return Ok(m);
            }
        }
        let key = if spec.starts_with("ram:") || crate::backing::is_remote(spec) {
            spec.to_string()
        } else {
            std::fs::canonicalize(spec)
                .map_err(|e| DmError::Device {
                    spec: spec.to_string(),
                    source: std::io::Error::new(
                        e.kind(),
                        format!("no mapping by that name and no such file: {e}"),
                    ),
                })?
                .to_string_lossy()
                .into_owned()
        };
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(dev) = open.get(&key).and_then(Weak::upgrade) {
            // A file that grew or shrank since it was opened is opened again, so that a
            // table reloaded after the change (a `resize`) sees its new size, as the kernel
            // sees a loop device's after `losetup -c`; live tables keep their open file.
            if regular_file_sectors(&key).is_none_or(|s| s * SECTOR_SIZE == dev.size()) {
                return Ok(dev);
            }
        }
        let dev: Arc<dyn BlockDevice> = if let Some(rest) = spec.strip_prefix("ram:") {
            let size_text = rest.split('#').next().unwrap_or_default();
            let size = parse_size(size_text)?;
            Arc::new(RamDisk::new(size).map_err(|source| DmError::Device {
                spec: spec.to_string(),
                source,
            })?)
        } else if let Some(remote) = crate::backing::open_remote(spec, self.file_options.read_only)
        {
            remote.map_err(|source| DmError::Device {
                spec: spec.to_string(),
                source,
            })?
        } else {
            Arc::new(
                FileBacking::open(&key, self.file_options).map_err(|source| DmError::Device {
                    spec: spec.to_string(),
                    source,
                })?,
            )
        };
        open.retain(|_, w| w.strong_count() > 0);
        open.insert(key, Arc::downgrade(&dev));
        Ok(dev)
    }
}

/// The size of `path` in whole sectors if it is a regular file (block devices keep the size
/// they were opened with).
fn regular_file_sectors(path: &str) -> Option<u64> {
    let meta = std::fs::metadata(path).ok()?;
    meta.is_file().then_some(meta.len() / SECTOR_SIZE)
}

impl DeviceResolver for Registry {
    fn open_device(&self, spec: &str) -> Result<Arc<dyn BlockDevice>, DmError> {
        Registry::open_device(self, spec)
    }
}

/// Mapping names follow the kernel's rules: non-empty, under 128 bytes, no `/`.
fn validate_name(name: &str) -> Result<(), DmError> {
    if name.is_empty()
        || name.len() >= 128
        || name.contains('/')
        || name.starts_with("ram:")
        || name == "."
        || name == ".."
        || name.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(DmError::State {
            name: name.to_string(),
            msg: "invalid mapping name (1-127 bytes, no '/', whitespace, or 'ram:' prefix)".into(),
        });
    }
    Ok(())
}
