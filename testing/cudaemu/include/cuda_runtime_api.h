// cudaemu's stand-in for the CUDA runtime API header.
//
// On the include path only in `--config=cudaemu` builds: product code includes
// <cuda_runtime_api.h> as it would with the CUDA Toolkit and gets the subset actpack uses,
// with CUDA's own type names, enumerator values and error strings, executed by the emulator
// (testing/cudaemu/runtime.cc). Nothing here is a shortcut for product code: it is the API a
// GPU build calls, run on the CPU.
#ifndef CUDAEMU_CUDA_RUNTIME_API_H_
#define CUDAEMU_CUDA_RUNTIME_API_H_

#include <cstddef>

#define CUDART_VERSION 13000
#define CUDAEMU 1

// The values are CUDA's (driver_types.h), so logs and error numbers read the same.
enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorSymbolNotFound = 500,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorLaunchOutOfResources = 701,
  cudaErrorLaunchFailure = 719,
  cudaErrorNotSupported = 801,
  cudaErrorUnknown = 999,
};
typedef enum cudaError cudaError_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

struct CUstream_st;
struct CUevent_st;
typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;

#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaStreamLegacy ((cudaStream_t)0x1)
#define cudaStreamPerThread ((cudaStream_t)0x2)

#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02

#define cudaHostAllocDefault 0x00

enum cudaMemoryType {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost = 1,
  cudaMemoryTypeDevice = 2,
  cudaMemoryTypeManaged = 3,
};

struct cudaPointerAttributes {
  enum cudaMemoryType type;
  int device;
  void* devicePointer;
  void* hostPointer;
};

// cudaGetDriverEntryPoint's flags and answers (driver_types.h).
enum cudaGetDriverEntryPointFlags {
  cudaEnableDefault = 0x0,
  cudaEnableLegacyStream = 0x1,
  cudaEnablePerThreadDefaultStream = 0x2,
};
enum cudaDriverEntryPointQueryResult {
  cudaDriverEntryPointSuccess = 0,
  cudaDriverEntryPointSymbolNotFound = 1,
  cudaDriverEntryPointVersionNotSufficent = 2,
};

const char* cudaGetErrorName(cudaError_t error);
const char* cudaGetErrorString(cudaError_t error);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);

cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
// "0000:BB:00.0" with bus BB = 0x10 + the device's ordinal (the NVML shim answers for the same).
cudaError_t cudaDeviceGetPCIBusId(char* pci_bus_id, int len, int device);

// The driver API's virtual memory management calls (testing/cudaemu/include/cuda.h has their
// types), as cudart hands them to a program that does not link libcuda. Unknown symbols give
// cudaSuccess with *function null, as CUDA's do.
cudaError_t cudaGetDriverEntryPoint(const char* symbol, void** function, unsigned long long flags,
                                    enum cudaDriverEntryPointQueryResult* status = nullptr);
cudaError_t cudaGetDriverEntryPointByVersion(
    const char* symbol, void** function, unsigned int cuda_version, unsigned long long flags,
    enum cudaDriverEntryPointQueryResult* status = nullptr);

cudaError_t cudaMalloc(void** ptr, size_t size);
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMallocHost(void** ptr, size_t size);
cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int flags);
cudaError_t cudaFreeHost(void* ptr);
cudaError_t cudaMallocAsync(void** ptr, size_t size, cudaStream_t stream);
cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream);
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes* attributes, const void* ptr);

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream = 0);
cudaError_t cudaMemset(void* ptr, int value, size_t count);
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream = 0);

cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags = 0);

cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = 0);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);

template <class T>
inline cudaError_t cudaMalloc(T** ptr, size_t size) {
  return cudaMalloc(reinterpret_cast<void**>(ptr), size);
}
template <class T>
inline cudaError_t cudaMallocHost(T** ptr, size_t size) {
  return cudaMallocHost(reinterpret_cast<void**>(ptr), size);
}
template <class T>
inline cudaError_t cudaMallocAsync(T** ptr, size_t size, cudaStream_t stream) {
  return cudaMallocAsync(reinterpret_cast<void**>(ptr), size, stream);
}

#endif  // CUDAEMU_CUDA_RUNTIME_API_H_
