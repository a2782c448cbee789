/*
 * libtriton_rust.so — the symbols the library exports.
 *
 * tritonserver finds these by name when a model's config.pbtxt says backend: "rust"
 * and the library sits at <backend-directory>/rust/libtriton_rust.so. They follow the
 * TRITONBACKEND API (version 1.16 or later 1.x); the types are the opaque handles of
 * Triton's tritonbackend.h, declared here only by name. Nothing else is exported:
 * the library links no Triton library and leaves Triton's symbols to the server.
 */
#ifndef TRITON_RUST_BACKEND_H
#define TRITON_RUST_BACKEND_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct TRITONSERVER_Error;
struct TRITONBACKEND_Backend;
struct TRITONBACKEND_Model;
struct TRITONBACKEND_ModelInstance;
struct TRITONBACKEND_Request;

/* Checks the server's backend API version; reads --backend-config=rust,<key>=<value>. */
struct TRITONSERVER_Error* TRITONBACKEND_Initialize(struct TRITONBACKEND_Backend* backend);
struct TRITONSERVER_Error* TRITONBACKEND_Finalize(struct TRITONBACKEND_Backend* backend);

/* Reads the model config, picks the engine, auto-completes and checks the config. */
struct TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(struct TRITONBACKEND_Model* model);
struct TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(struct TRITONBACKEND_Model* model);

/* One engine (e.g. one ONNX Runtime session) per instance. */
struct TRITONSERVER_Error* TRITONBACKEND_ModelInstanceInitialize(struct TRITONBACKEND_ModelInstance* instance);
struct TRITONSERVER_Error* TRITONBACKEND_ModelInstanceFinalize(struct TRITONBACKEND_ModelInstance* instance);

/* Answers and releases every request it is given, then returns NULL. */
struct TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(
    struct TRITONBACKEND_ModelInstance* instance, struct TRITONBACKEND_Request** requests,
    uint32_t request_count);

#ifdef __cplusplus
}
#endif

#endif /* TRITON_RUST_BACKEND_H */
