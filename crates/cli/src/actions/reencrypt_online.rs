//! `open` of a LUKS2 volume mid-reencryption (cryptsetup's activation): the recovery of a
//! cut hotzone and the table of both segments are
//! [`cryptblk_volume::reencrypt::activate`]'s; this supplies the passphrase or token and
//! serves the plan. Online runs of `reencrypt` are [`super::reencrypt`]'s (the daemon's
//! steps are [`cryptblk_volume::reencrypt::online`]).

use super::reencrypt::{luks_type, CliInput};
use crate::args::{OpenArgs, Opts};
use crate::exit::ActionResult;
use cryptblk_volume::reencrypt::activate::{mid_reencryption_plan, MidReencryption};
use cryptblk_volume::Volume;

/// `open` of a LUKS2 volume mid-reencryption: both keys from one passphrase, the hotzone of
/// a cut step recovered first, then a table of both segments served. The header is on the
/// device or detached (`--header`).
pub fn open_mid_reencryption(opts: &Opts, a: &OpenArgs, vol: Volume) -> ActionResult {
    let name = super::activate::mapping_name(a)?;
    let flags = super::luks::persistent::effective(opts, &a.perf, &vol.stored_flags());
    let at = MidReencryption {
        device: &a.device,
        header: opts.header.as_deref(),
        luks_type: luks_type(opts),
        key_slot: opts.key_slot.map(|s| s as usize),
        readonly: opts.readonly,
        name,
        flags: &flags.library(),
    };
    let mut input = CliInput {
        opts,
        device: &a.device,
    };
    let plan = mid_reencryption_plan(vol, &at, &mut input)?;
    super::activate::serve_plan(plan, opts, a)
}
