// The Rust snippets of README.md and docs/bindings/rust.md as a program:
// the data they take from their caller.
fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let keys = random(1024 * 2 * 64, 1);
    let values = random(1024 * 2 * 64, 2);
    let query = random(4 * 64, 3);
    let _ = (&keys, &values, &query);
@SNIPPET@
    println!("snippet ran");
    Ok(())
}
