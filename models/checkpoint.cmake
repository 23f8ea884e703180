# mesh_checkpoint: checkpoints read where they lie (mmap): GGUF and safetensors (single files and
# sharded Hugging Face directories), ggml's tensor types (their blocks are graph/quant.hpp's, so it
# links mesh_graph) and their CPU dequantization, and the
# architecture's hyper-parameters from config.json or GGUF metadata (docs/models.md, "Checkpoints").
find_package(nlohmann_json REQUIRED)
add_library(mesh_checkpoint
  mapped_file.cpp tensor_type.cpp dequantize.cpp safetensors_view.cpp gguf.cpp checkpoint.cpp model_config.cpp)
target_include_directories(mesh_checkpoint PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>)
target_link_libraries(mesh_checkpoint PUBLIC mesh_base mesh_graph PRIVATE nlohmann_json::nlohmann_json)
