// Backward kernels that write a gradient into the decoded activation they consume.
//
// A tensor actpack decodes in backward is fresh memory that only the autograd node which
// unpacked it reads, once. Several ops of conv nets and transformers read their saved
// activation and return a gradient of its shape and layout, so that memory can hold the
// gradient and the op allocates nothing of the activation's size at the step's peak:
//   - batch norm (its own kernel: ATen's CPU one allocates its input gradient twice, an
//     empty_like before its fast path and again inside it);
//   - ReLU, GELU, SiLU (ATen's own out= kernels, the output over the input: bit for bit);
//   - a 1x1 convolution over a channels_last input, the widest activations of a ResNet
//     bottleneck (the weight gradient first, then the input gradient as one matrix product
//     into the input's memory).
//
//   OfferAsScratch(decoded);        // Unpack, for a tensor it just decoded in backward
//   ... the node's op runs: a lean kernel takes the offer and writes into `decoded`
//
// An offer is taken only by the op of the autograd formula it was made for (a custom
// Function's backward may read its saved tensors again after an op) and only with grad mode
// off (a create_graph backward may save the tensor). The kernels are registered for ATen's CPU
// dispatch key once per process, by the first session, and send every call that brings no
// offer to ATen's kernel, so user code, plain training and the `identity` codec compute what
// they did.
#ifndef ACTPACK_TORCH_PLUGIN_CSRC_LEAN_BACKWARD_H_
#define ACTPACK_TORCH_PLUGIN_CSRC_LEAN_BACKWARD_H_

#include <torch/types.h>

namespace actpack::torch_plugin {

// Lets the running backward node's op overwrite `decoded`, which Unpack has just decoded for
// it. Does nothing when no node runs, when grad mode is on (a backward with create_graph=True
// may save the tensor for the next backward) or for a tensor off the CPU (the kernels are the
// CPU's; on CUDA decoded tensors go to ATen's and cuDNN's kernels as before).
void OfferAsScratch(const at::Tensor& decoded);

// Registers the lean kernels for ATen's CPU key; later calls do nothing.
void RegisterLeanBackwardKernels();

// Whether Unpack offers decoded tensors (on by default). Off, every op computes as ATen does:
// the tests compare the two.
void SetLeanBackward(bool enabled);

// How many offers the lean kernels have taken in this process (tests read it).
int64_t LeanBackwardTaken();

}  // namespace actpack::torch_plugin

#endif  // ACTPACK_TORCH_PLUGIN_CSRC_LEAN_BACKWARD_H_
