//! All 85 LUKS2 metadata-validation images from cryptsetup's test suite must behave as
//! `luks2-validation-expected.tsv` lists them (R: loads, F: rejected without panic,
//! T: token 0 removed and written, then loads again), and for every loadable image the
//! metadata cryptblk sees must equal what the real `cryptsetup luksDump` shows.

mod luks2_common;

use cryptblk_format::luks2::Luks2Header;
use luks2_common::*;

fn cases() -> Vec<(String, char)> {
    let tsv = std::fs::read_to_string(tests_dir().join("luks2-validation-expected.tsv")).unwrap();
    tsv.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let mut f = l.split('\t');
            let name = f.next().unwrap().to_string();
            let exp = f.next().unwrap().chars().next().unwrap();
            (name, exp)
        })
        .collect()
}

#[test]
fn validation_images_behave_as_upstream_expects() {
    let check_tool = have_cryptsetup();
    let dir = Scratch::new("l2val");
    untar("luks2-validation-images.tar.xz", &dir.0);
    let cases = cases();
    assert_eq!(cases.len(), 85, "expected.tsv should list 85 images");
    let mut failures = Vec::new();
    for (name, exp) in &cases {
        let path = dir.0.join("luks2-images").join(name);
        let file = open_rw(&path);
        let loaded = Luks2Header::read(&file);
        match (exp, loaded) {
            ('F', Ok(_)) => failures.push(format!("{name}: loaded but must be rejected")),
            ('F', Err(_)) => {}
            ('R' | 'T', Err(e)) => failures.push(format!("{name}: rejected: {e}")),
            ('R', Ok(h)) => {
                if check_tool {
                    // cryptsetup may repair a damaged copy on disk: compare on a copy.
                    let copy = dir.0.join(format!("{name}.copy"));
                    std::fs::copy(&path, &copy).unwrap();
                    let (rc, out, err) = cryptsetup(
                        &["luksDump", "--dump-json-metadata", copy.to_str().unwrap()],
                        b"",
                    );
                    if rc != 0 {
                        failures.push(format!("{name}: cryptsetup rejects it: {err}"));
                    } else if out != h.dump_json() {
                        failures.push(format!(
                            "{name}: JSON differs from cryptsetup\n--- cryptsetup\n{out}\n--- cryptblk\n{}",
                            h.dump_json()
                        ));
                    }
                    let (_, text, _) = cryptsetup(&["luksDump", copy.to_str().unwrap()], b"");
                    if rc == 0 && text != h.dump() {
                        failures.push(format!(
                            "{name}: luksDump text differs\n--- cryptsetup\n{text}\n--- cryptblk\n{}",
                            h.dump()
                        ));
                    }
                }
            }
            ('T', Ok(mut h)) => {
                if let Err(e) = h.remove_token(0).and_then(|_| h.write(&file)) {
                    failures.push(format!("{name}: token remove/write failed: {e}"));
                    continue;
                }
                drop(file);
                let file = open_rw(&path);
                match Luks2Header::read(&file) {
                    Ok(h2) => {
                        assert!(h2.token(0).is_none());
                        let _ = h2.dump();
                    }
                    Err(e) => failures.push(format!("{name}: unreadable after write: {e}")),
                }
                if check_tool {
                    let (rc, _, err) = cryptsetup(&["luksDump", path.to_str().unwrap()], b"");
                    if rc != 0 {
                        failures.push(format!("{name}: cryptsetup rejects our write: {err}"));
                    }
                }
            }
            (other, _) => panic!("unknown expectation {other}"),
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
