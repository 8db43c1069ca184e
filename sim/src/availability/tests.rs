use super::*;

#[test]
fn calibration_print() {
    for p in [Profile::Office, Profile::Pool, Profile::Notebook] {
        let d = 14 * 86_400;
        let hosts = generate(p, 100, d, 1);
        let s = stats(&hosts, d);
        let steps: usize = hosts.iter().map(|h| h.steps().len()).sum();
        println!("{p}: {s:#?} steps/host {}", steps / 100);
    }
}
