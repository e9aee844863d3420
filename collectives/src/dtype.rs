//! bf16 buffers: widened to f32 for the collective, narrowed back once.
//!
//! Training keeps gradients in bf16 more often than not. A bf16 bucket is
//! widened into a scratch f32 buffer the communicator keeps (it only
//! grows, so a training loop allocates it once), the collective runs on
//! that with the configured wire codec, and the result is rounded back to
//! bf16 (nearest, ties to even) once, at the end: sums are not rounded at
//! every hop, as a bf16 wire would. Widening is exact, so with the f32
//! codec all-gather and broadcast return the inputs bit for bit (the i16
//! codec quantizes them as it does f32 buckets); a reduction's result is the
//! f32 result rounded to bf16 (at most 2^-8 of its magnitude beyond the
//! f32 one: bf16 keeps 8 significant bits), and identical on every rank
//! because the f32 result is.
//! With the f32 codec the wire carries 4 bytes per element; the i16 codec
//! carries 2, as many as the bf16 input.

use half::slice::HalfFloatSliceExt;

pub use half::bf16;

use crate::error::Result;

/// Runs `collective` on `buf` widened to f32 in `scratch`, then narrows
/// the result back into `buf`; on an error `buf` is left as it was.
pub(crate) fn through_f32(
    buf: &mut [bf16],
    scratch: &mut Vec<f32>,
    collective: impl FnOnce(&mut [f32]) -> Result<()>,
) -> Result<()> {
    // Grown (zero-filled) only when too short: no pass over it otherwise.
    if scratch.len() < buf.len() {
        scratch.resize(buf.len(), 0.0);
    }
    let wide = &mut scratch[..buf.len()];
    buf.convert_to_f32_slice(wide);
    collective(wide)?;
    buf.convert_from_f32_slice(wide);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widening_is_exact_and_narrowing_rounds_to_nearest_even() {
        let mut buf = [bf16::from_f32(1.5), bf16::from_f32(-3.0), bf16::MAX];
        let mut scratch = Vec::new();
        through_f32(&mut buf, &mut scratch, |x| {
            assert_eq!(x, [1.5, -3.0, bf16::MAX.to_f32()]);
            // 1 + 2^-8 is halfway between 1 and the next bf16 (1 + 2^-7):
            // ties go to the even one, 1. 1 + 3 * 2^-8 goes up to 1 + 2^-6.
            x[0] = 1.0 + 2f32.powi(-8);
            x[1] = 1.0 + 3.0 * 2f32.powi(-8);
            Ok(())
        })
        .unwrap();
        assert_eq!(buf[0], bf16::ONE);
        assert_eq!(buf[1].to_f32(), 1.0 + 2f32.powi(-6));
        assert_eq!(buf[2], bf16::MAX);
    }

    #[test]
    fn a_failed_collective_leaves_the_buffer_alone_and_the_scratch_is_reused() {
        let mut buf = vec![bf16::from_f32(2.0); 1000];
        let mut scratch = Vec::new();
        let err = through_f32(&mut buf, &mut scratch, |x| {
            x.fill(7.0);
            Err(crate::Error::Busy)
        });
        assert_eq!(err, Err(crate::Error::Busy));
        assert!(buf.iter().all(|&x| x == bf16::from_f32(2.0)));
        let cap = scratch.capacity();
        let ptr = scratch.as_ptr();
        through_f32(&mut buf[..10], &mut scratch, |_| Ok(())).unwrap();
        assert_eq!((scratch.capacity(), scratch.as_ptr()), (cap, ptr));
    }
}
