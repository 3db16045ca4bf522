//! Crash safety of token updates (`token import|remove`): the header write is interrupted at
//! every write it issues (cleanly and torn); the device left behind loads with the old tokens
//! or the new ones, never a mix and never unreadable.

use cryptblk_cipher::hash::HashAlgorithm;
use cryptblk_format::hdrio::{FaultPlan, FaultyIo, MemIo};
use cryptblk_format::kdf::PbkdfRequest;
use cryptblk_format::luks2::{FormatParams, KeyslotParams, Luks2Header};
use serde_json::{json, Value};

fn base() -> Vec<u8> {
    let dev = MemIo::zeroed(3 << 20);
    let p = FormatParams {
        keyslots_size: Some(1 << 20),
        keyslot: KeyslotParams::new(
            PbkdfRequest::pbkdf2(HashAlgorithm::Sha256).with_forced_iterations(1000),
        ),
        ..FormatParams::default()
    };
    let (mut h, _, _) = Luks2Header::format(&dev, &p, b"pw").unwrap();
    h.import_token(Some(0), json!({"type": "x", "keyslots": ["0"]}))
        .unwrap();
    h.write(&dev).unwrap();
    dev.into_inner()
}

fn tokens(h: &Luks2Header) -> Value {
    h.json()["tokens"].clone()
}

#[test]
fn token_updates_survive_a_crash_at_every_write() {
    let image = base();
    let before = tokens(&Luks2Header::read(&MemIo::new(image.clone())).unwrap());
    type Op = fn(&mut Luks2Header);
    let ops: [(&str, Op); 2] = [
        ("import", |h| {
            h.import_token(
                Some(3),
                json!({"type": "clevis", "keyslots": ["0"], "jwe": {}}),
            )
            .unwrap();
        }),
        ("remove", |h| h.remove_token(0).unwrap()),
    ];
    for (name, op) in ops {
        let after = {
            let dev = MemIo::new(image.clone());
            let mut h = Luks2Header::read(&dev).unwrap();
            op(&mut h);
            tokens(&h)
        };
        let mut crashes = 0;
        for torn in [0usize, 1, 3] {
            for n in 0.. {
                let dev = FaultyIo::new(
                    MemIo::new(image.clone()),
                    FaultPlan {
                        fail_write: Some(n),
                        torn_sectors: torn,
                    },
                );
                let result = {
                    let mut h = Luks2Header::read(&dev).unwrap();
                    op(&mut h);
                    h.write(&dev)
                };
                let attempted = dev.writes_attempted();
                let left = MemIo::new(dev.into_inner().into_inner());
                let h = Luks2Header::read(&left)
                    .unwrap_or_else(|e| panic!("{name}: crash at write {n} (torn {torn}): {e}"));
                let t = tokens(&h);
                assert!(
                    t == before || t == after,
                    "{name}: crash at write {n} (torn {torn}) left tokens {t}"
                );
                if attempted <= n {
                    result.unwrap();
                    assert_eq!(t, after, "{name}: final state");
                    break;
                }
                assert!(result.is_err());
                crashes += 1;
            }
        }
        assert!(
            crashes >= 2,
            "{name}: the write issued fewer writes than expected"
        );
    }
}
