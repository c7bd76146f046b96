// Backward kernels that write a gradient into the decoded activation they consume.
//
// A tensor actpack decodes in backward is fresh memory that only the autograd node which
// unpacked it reads, once. Batch norm's and ReLU's backward read their saved activation
// elementwise and return a gradient of the same shape and layout, so that memory can hold the
// gradient: the op allocates nothing of the activation's size. ATen's CPU batch norm backward
// allocates its input gradient twice (an empty_like before its fast path, again inside it), so
// for it the saving is two activations' bytes at the step's peak; for ReLU one.
//
//   OfferAsScratch(decoded);        // Unpack, for a tensor it just decoded in backward
//   ... the node's op runs: a lean kernel takes the offer and writes into `decoded`
//
// The kernels are registered for ATen's CPU dispatch key once per process (by the first
// session) and fall back to ATen's own kernels for every tensor not offered, so everything else
// (user code, plain training, the `identity` codec) computes bit for bit what it did.
#ifndef ACTPACK_TORCH_PLUGIN_CSRC_LEAN_BACKWARD_H_
#define ACTPACK_TORCH_PLUGIN_CSRC_LEAN_BACKWARD_H_

#include <torch/types.h>

namespace actpack::torch_plugin {

// Lets the running backward node's op overwrite `decoded`, which Unpack has just decoded for
// it. Does nothing when no node runs or grad mode is on: a backward with create_graph=True may
// save the tensor for the next backward.
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
