# mesh_inference: a checkpoint generating text. The tokenizer a checkpoint brings, its tensors as
# graph parameters, the architectures as graph builders, the session that runs them on a
# gpu::executor with the KV cache on the device, sampling and generation (docs/models.md).
add_library(mesh_inference STATIC
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint_tokenizer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/layer_range.cpp
  ${CMAKE_CURRENT_LIST_DIR}/model_weights.cpp
  ${CMAKE_CURRENT_LIST_DIR}/layers.cpp
  ${CMAKE_CURRENT_LIST_DIR}/transformer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/finetune.cpp
  ${CMAKE_CURRENT_LIST_DIR}/peft.cpp
  ${CMAKE_CURRENT_LIST_DIR}/hf_export.cpp
  ${CMAKE_CURRENT_LIST_DIR}/session.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sequence_model.cpp
  ${CMAKE_CURRENT_LIST_DIR}/pipeline.cpp
  ${CMAKE_CURRENT_LIST_DIR}/stage_plan.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sampler.cpp
  ${CMAKE_CURRENT_LIST_DIR}/generate.cpp)
target_include_directories(mesh_inference PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>)
# The session drives an executor through gpu/executor.hpp; the gpu layer is defined after this one
# (the target is resolved when the build is generated).
target_link_libraries(mesh_inference PUBLIC mesh_checkpoint mesh_text mesh_graph mesh_gpu PRIVATE fmt::fmt nlohmann_json::nlohmann_json)
