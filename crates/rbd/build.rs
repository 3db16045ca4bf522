//! Generates the librbd/librados bindings from the installed headers (Debian's `librbd-dev`).

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rustc-link-lib=rbd");
    println!("cargo:rustc-link-lib=rados");
    let bindings = bindgen::Builder::default()
        .header("wrapper.h")
        // Only what the wrapper calls: the headers pull in much of libc otherwise.
        .allowlist_function("rados_(create|conf_set|conf_read_file|conf_parse_env|connect|shutdown|ioctx_create|ioctx_destroy|ioctx_set_namespace)")
        .allowlist_function("rbd_(open|open_read_only|close|stat|version|aio_.*|lock_acquire)")
        .allowlist_type("rbd_image_info_t")
        .allowlist_type("rbd_lock_mode_t")
        .allowlist_var("RBD_.*")
        .layout_tests(false)
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
