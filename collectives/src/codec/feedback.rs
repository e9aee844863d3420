//! Error-feedback residuals, keyed by a caller-given tensor id.
//!
//! Before a reduction the residual is added to the rank's contribution
//! (`x' = x + r`) and reset; every quantization the rank performs of values
//! that flow into the result adds its error (`v - q*scale`) back. The
//! result's quantization error therefore reappears in the next step's
//! input, so the error of the running sum over steps stays bounded and the
//! mean error tends to zero.

use std::collections::HashMap;

use crate::error::{Error, Result};

#[derive(Debug, Default)]
pub struct Residuals {
    by_tensor: HashMap<u64, Vec<f32>>,
}

impl Residuals {
    /// Takes the residual of `tensor` out of the store (allocating zeros on
    /// first use); put it back with [`Residuals::restore`].
    pub fn take(&mut self, tensor: u64, len: usize) -> Result<Vec<f32>> {
        let r = self
            .by_tensor
            .remove(&tensor)
            .unwrap_or_else(|| vec![0.0; len]);
        if r.len() != len {
            let got = r.len();
            self.by_tensor.insert(tensor, r);
            return Err(Error::ResidualLength {
                tensor,
                got,
                want: len,
            });
        }
        Ok(r)
    }

    pub fn restore(&mut self, tensor: u64, r: Vec<f32>) {
        self.by_tensor.insert(tensor, r);
    }

    /// The current residual of a tensor (for inspection and tests).
    pub fn get(&self, tensor: u64) -> Option<&[f32]> {
        self.by_tensor.get(&tensor).map(|v| v.as_slice())
    }

    /// Forgets a tensor's residual (e.g. when its shape changes).
    pub fn clear(&mut self, tensor: u64) {
        self.by_tensor.remove(&tensor);
    }
}
