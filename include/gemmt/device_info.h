// The properties of a GPU that the planners (kernels/plan/) read, beside the SM count and
// compute capability GemmArgs carries: L2 size, DRAM bandwidth and SM clock. Free of CUDA
// headers, so that the planners and their CPU tests can fill it with any description.
//
// The wrapper fills it once per device (pytorch_wrapper/common.cpp, device_info) from
// cudaDeviceGetAttribute: cudaDevAttrL2CacheSize, cudaDevAttrMemoryClockRate,
// cudaDevAttrGlobalMemoryBusWidth and cudaDevAttrClockRate. (CUDA 13 removed the
// cudaDeviceProp fields clockRate and memoryClockRate; the attributes remain, and are what
// the runtime reads for those fields in older releases.)
//
// A field of 0 is unknown, and the planners then use the reference device's value: the
// H100 SXM on which the planners' constants were measured. So a GemmArgs that leaves this
// alone (a program built against the kernel layer that predates it) plans as before.
#pragma once

#include <cstdint>

namespace gemmt {

struct DeviceInfo {
  int64_t l2_bytes = 0;      // cudaDevAttrL2CacheSize
  int memory_clock_khz = 0;  // cudaDevAttrMemoryClockRate (peak)
  int memory_bus_bits = 0;   // cudaDevAttrGlobalMemoryBusWidth
  int sm_clock_khz = 0;      // cudaDevAttrClockRate (peak)

  // Peak DRAM bandwidth in bytes per second: two transfers per memory clock (DDR signalling,
  // as HBM and GDDR report their clocks) over the bus; 0 when either is unknown.
  double dram_bytes_per_s() const {
    return 2.0 * 1e3 * static_cast<double>(memory_clock_khz) *
           (static_cast<double>(memory_bus_bits) / 8.0);
  }
};

// The device the planners' constants were fitted on: NVIDIA H100 80GB HBM3 (SXM5, 132 SMs)
// as the CUDA runtime reports it: 50 MiB of L2, HBM3 at 2619 MHz on a 5120-bit bus
// (3.35 TB/s), SMs at up to 1980 MHz.
inline constexpr DeviceInfo kReferenceDevice{52428800, 2619000, 5120, 1980000};
inline constexpr int kReferenceSmCount = 132;

// A description with its unknown fields taken from the reference device.
inline DeviceInfo known_or_reference(const DeviceInfo& d) {
  DeviceInfo r = d;
  if (r.l2_bytes <= 0) r.l2_bytes = kReferenceDevice.l2_bytes;
  // Bandwidth needs both halves: a clock without its bus width says nothing.
  if (r.memory_clock_khz <= 0 || r.memory_bus_bits <= 0) {
    r.memory_clock_khz = kReferenceDevice.memory_clock_khz;
    r.memory_bus_bits = kReferenceDevice.memory_bus_bits;
  }
  if (r.sm_clock_khz <= 0) r.sm_clock_khz = kReferenceDevice.sm_clock_khz;
  return r;
}

// The device's property over the reference device's, as the planners scale a constant
// fitted on the reference: constant * ratio. Exactly 1 on the reference device (the same
// numbers divided), so its plans do not move by a rounding.
inline double l2_ratio(const DeviceInfo& d) {
  const DeviceInfo k = known_or_reference(d);
  return static_cast<double>(k.l2_bytes) / static_cast<double>(kReferenceDevice.l2_bytes);
}
inline double dram_ratio(const DeviceInfo& d) {
  return known_or_reference(d).dram_bytes_per_s() / kReferenceDevice.dram_bytes_per_s();
}
inline double sm_clock_ratio(const DeviceInfo& d) {
  return static_cast<double>(known_or_reference(d).sm_clock_khz) /
         static_cast<double>(kReferenceDevice.sm_clock_khz);
}

}  // namespace gemmt
