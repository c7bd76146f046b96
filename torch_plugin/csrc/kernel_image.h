// Whether this build's CUDA kernels can run on a device. Checked once per device, at its first
// CUDA use by actpack (ContextFor: every pack, unpack and codec call on a CUDA tensor), so that
// a GPU whose architecture the build left out (a T4 or V100 under a build for sm_80 and sm_90)
// fails with a message naming the device, its architecture and the build's, rather than at a
// kernel launch with "no kernel image is available for execution on the device".
#ifndef ACTPACK_TORCH_PLUGIN_CSRC_KERNEL_IMAGE_H_
#define ACTPACK_TORCH_PLUGIN_CSRC_KERNEL_IMAGE_H_

#include <string>

namespace actpack::torch_plugin {

// The architectures this build's CUDA kernels were compiled for, as nvcc's -gencode code=
// values ("sm_80 sm_90 compute_90": machine code for sm_80 and sm_90, PTX for compute_90 that
// the driver compiles for newer GPUs); "" in a build without CUDA.
std::string CudaArchitecturesBuilt();

// What a device that can run none of the build's kernels is told: the device (`device`, its
// `name`, compute capability `major`.`minor`), the architectures the build holds (`built`, as
// CudaArchitecturesBuilt() gives them) and how to build for it. `ptx_too_new`: the build has
// PTX the device could take, but the driver is older than the toolkit that wrote it.
std::string NoKernelImageMessage(int device, const std::string& name, int major, int minor,
                                 const std::string& built, bool ptx_too_new = false);

// Throws c10::Error (RuntimeError in Python) with NoKernelImageMessage when CUDA device
// `device` can run none of this build's kernels; returns at once after the first check that
// passed for the device. A no-op in a build without CUDA.
void CheckKernelImage(int device);

}  // namespace actpack::torch_plugin

#endif  // ACTPACK_TORCH_PLUGIN_CSRC_KERNEL_IMAGE_H_
