//! What every `open` shares once a volume is unlocked: the mapping name it was given, and
//! handing the library's activation plan to the serving path with the export and read-only
//! mode the command line asked for. Used by each volume type's `open`; imports none of them.

use crate::args::{OpenArgs, Opts};
use crate::exit::{ActionResult, Failure};
use cryptblk_volume::plan::ActivationPlan;
use cryptblk_volume::serve::ServeSpec;

/// The mapping name `open` was given, refused unless it is a valid volume name.
pub(super) fn mapping_name(a: &OpenArgs) -> Result<&str, Failure> {
    let name = a
        .name
        .as_deref()
        .ok_or_else(|| Failure::usage("open needs a mapping name"))?;
    cryptblk_volume::control::check_name(name)?;
    Ok(name)
}

/// Serves `plan` through the export `open` was given, as a new daemon. Keyed lower
/// mappings (a TCRYPT chain's layers) go through the daemon's pipe with the top table,
/// created first in the same daemon.
pub(super) fn serve_plan(plan: ActivationPlan, opts: &Opts, a: &OpenArgs) -> ActionResult {
    let export = super::serving::export_spec(&a.export, &plan.name)?;
    let (spec, lower) = ServeSpec::from_plan(plan, export, opts.readonly);
    super::serving::start_stack(spec, lower, &a.export, opts.json)
}

/// What the daemon serves for `plan` with the export and read-only mode asked for (a plan
/// without keyed lower mappings: LUKS).
pub(super) fn serve_spec(
    plan: ActivationPlan,
    opts: &Opts,
    a: &OpenArgs,
) -> Result<ServeSpec, Failure> {
    let export = super::serving::export_spec(&a.export, &plan.name)?;
    Ok(ServeSpec::from_plan(plan, export, opts.readonly).0)
}
