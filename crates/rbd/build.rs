//! Generates the librbd/librados bindings from the installed headers (Debian's `librbd-dev`)
//! as a table of functions loaded at run time (`libloading`), not linked: a process that
//! never opens an RBD image never maps librbd and its ~30 libraries (issue 28's memory per
//! idle served volume), so nothing is linked here.

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    let bindings = bindgen::Builder::default()
        .header("wrapper.h")
        // Only what the wrapper calls: the headers pull in much of libc otherwise.
        .allowlist_function("rados_(create|conf_set|conf_read_file|conf_parse_env|connect|shutdown|ioctx_create|ioctx_destroy|ioctx_set_namespace)")
        .allowlist_function("rbd_(open|open_read_only|close|stat|version|aio_.*|lock_acquire)")
        .allowlist_type("rbd_image_info_t")
        .allowlist_type("rbd_lock_mode_t")
        .allowlist_var("RBD_.*")
        .layout_tests(false)
        // `sys::Librbd::new(path)` loads the library and fails if any function is missing.
        .dynamic_library_name("Librbd")
        .dynamic_link_require_all(true)
        .generate()
        .unwrap_or_else(|e| {
            panic!(
                "cannot generate the librbd bindings ({e}); install librbd-dev and libclang-dev, \
                 or build without the `rbd` feature"
            )
        });
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("write bindings.rs");
}
