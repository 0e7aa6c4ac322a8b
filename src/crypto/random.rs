//! Random numbers for spreading retries and polls over time (never for keys: those come from
//! the OpenPGP and TLS libraries' own generators).

/// A uniform fraction in [0, 1) from the kernel's random source (0 if it cannot answer, which
/// only takes the spread away).
pub(crate) fn fraction() -> f64 {
    let mut r = [0u8; 8];
    rustix::rand::getrandom(&mut r, rustix::rand::GetRandomFlags::empty()).ok();
    (u64::from_le_bytes(r) >> 11) as f64 / (1u64 << 53) as f64
}

/// 128 random bits as 32 lowercase hex digits, naming one run of a process (a join client's
/// session). All zeros if the kernel cannot answer: every run is then the same one, which only
/// ever refuses more.
pub(crate) fn run_id() -> String {
    let mut r = [0u8; 16];
    rustix::rand::getrandom(&mut r, rustix::rand::GetRandomFlags::empty()).ok();
    r.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn fractions_stay_in_range_and_vary() {
        let xs: Vec<f64> = (0..64).map(|_| super::fraction()).collect();
        assert!(xs.iter().all(|x| (0.0..1.0).contains(x)));
        assert!(xs.iter().any(|x| *x != xs[0]));
    }
}
