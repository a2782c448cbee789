//! A GPU made of host memory for the core's tests: copies between simulated views,
//! gathers counted, allocations of zeroed host bytes.

use std::sync::atomic::{AtomicUsize, Ordering};

use triton_rust_cuda::{Bytes, BytesMut, DeviceBuffer, DeviceOps, DeviceView};

#[derive(Default)]
pub struct FakeDevice {
    pub gathers: AtomicUsize,
}

impl DeviceOps for FakeDevice {
    fn copy(&self, src: Bytes<'_>, dst: BytesMut<'_>) -> triton_rust_cuda::Result<()> {
        let from = match src {
            Bytes::Host(b) => b,
            Bytes::Device(v) => v.simulated_bytes().expect("fake device memory"),
        };
        match dst {
            BytesMut::Host(d) => triton_rust_cuda::copy_host(from, d),
            BytesMut::Device(mut v) => {
                triton_rust_cuda::copy_host(from, v.simulated_bytes().expect("fake device memory"))
            }
        }
    }
    fn gather(
        &self,
        device: i32,
        parts: &[DeviceView<'_>],
    ) -> triton_rust_cuda::Result<DeviceBuffer> {
        self.gathers.fetch_add(1, Ordering::Relaxed);
        let bytes = parts
            .iter()
            .flat_map(|p| p.simulated_bytes().expect("fake device memory").iter().copied())
            .collect();
        Ok(DeviceBuffer::simulated(device, bytes))
    }
    fn alloc(&self, device: i32, bytes: usize) -> triton_rust_cuda::Result<DeviceBuffer> {
        Ok(DeviceBuffer::simulated(device, vec![0; bytes]))
    }
}
