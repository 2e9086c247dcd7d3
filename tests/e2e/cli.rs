//! `prescale check` on files, as a platform engineer would run it in CI.

use std::process::Command;

/// A fresh directory holding `file_text` as `so.yaml`: (directory, file path).
fn scratch_file(tag: &str, file_text: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(crate::harness::unique(tag));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("so.yaml");
    std::fs::write(&f, file_text).unwrap();
    (dir, f)
}

fn check(args: &[&str], file_text: &str) -> (i32, String) {
    let (dir, f) = scratch_file("prescale-check", file_text);
    let out = Command::new(env!("CARGO_BIN_EXE_prescale")).arg("check").arg(&f).args(args).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
}

const GOOD: &str = r#"
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {name: worker, namespace: jobs}
spec:
  scaleTargetRef: {name: worker}
  triggers:
  - type: external
    metadata:
      scalerAddress: prescale.prescale.svc:9090
      rabbitmqHostFromEnv: RABBITMQ_URL
      rabbitmqQueueName: jobs
      rabbitmqPerReplica: "10"
"#;

#[test]
fn check_accepts_a_valid_scaled_object_and_prints_the_typed_config() {
    let (code, out) = check(&["--env", "RABBITMQ_URL=amqp://u:secretpw@rabbit:5672/%2f"], GOOD);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("ok: jobs/worker trigger 0"), "{out}");
    assert!(out.contains("\"perReplica\": 10.0"), "{out}");
    assert!(!out.contains("secretpw"), "credentials printed: {out}");
    // No HPA behaviour: the defaults that would apply the plan late are a note, not a failure.
    assert!(out.contains("note: the HPA's scale-down stabilization is 300 s (Kubernetes' default)"), "{out}");
}

#[test]
fn check_lists_every_error_and_fails() {
    let bad = GOOD.replace("rabbitmqPerReplica: \"10\"", "rabbitmqPerReplica: \"-1\"\n      sloSecond: \"5\"");
    let (code, out) = check(&[], &bad);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("invalid: jobs/worker"), "{out}");
    assert!(out.contains("rabbitmqPerReplica") && out.contains("\"-1\""), "{out}");
    assert!(
        out.contains("sloSecond") && out.contains("did you mean \\\"sloSeconds\\\"")
            || out.contains("did you mean \"sloSeconds\""),
        "{out}"
    );
}

#[test]
fn every_example_parses() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "yaml") {
            let text = std::fs::read_to_string(&p).unwrap();
            if !text.contains("kind: ScaledObject") {
                continue;
            }
            let out = Command::new(env!("CARGO_BIN_EXE_prescale")).arg("check").arg(&p).output().unwrap();
            assert!(out.status.success(), "{}: {}", p.display(), String::from_utf8_lossy(&out.stdout));
            n += 1;
        }
    }
    assert!(n >= 1, "no ScaledObject examples found in {}", dir.display());
}

#[test]
fn a_report_that_cannot_be_written_is_an_error_not_a_pass() {
    // stdout on /dev/full (ENOSPC): `check` and `keys` fail, `check` saying why; a closed
    // pipe (`| head`) is not an error (see replay.rs).
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        return; // not Linux
    };
    let (dir, f) = scratch_file("prescale-check-full", GOOD);
    let out = Command::new(env!("CARGO_BIN_EXE_prescale"))
        .arg("check")
        .arg(&f)
        .stdout(full.try_clone().unwrap())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "check passed with its report unwritten: {err}");
    assert!(err.contains("writing the check report"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_prescale")).arg("keys").stdout(full).output().unwrap();
    assert!(!out.status.success(), "keys passed with its table unwritten");
    let _ = std::fs::remove_dir_all(&dir);
}
