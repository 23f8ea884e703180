# Tests of mesh_inference: the GGUF tokenizer, weights, sampling and sessions (models_inference_tests),
# and every architecture against ref_llm.py, an independent PyTorch reference (models_reference_tests;
# a case warns and passes when python3 or torch is missing), and pipeline stages (models_stage_tests).
if(TARGET mesh_inference)
  find_package(nlohmann_json REQUIRED)
  mesh_add_test(models_inference_tests
    SOURCES test_gguf_tokenizer.cpp test_sampler.cpp test_session.cpp test_greedy_decode.cpp
    LIBS mesh_inference)
  mesh_add_test(models_reference_tests
    SOURCES test_reference_llm.cpp
    LIBS mesh_inference nlohmann_json::nlohmann_json)
  target_compile_definitions(models_reference_tests PRIVATE MESH_MODELS_TEST_DIR="${CMAKE_CURRENT_SOURCE_DIR}")
  # Fine-tuning graphs: loss and gradients against ref_train.py (PyTorch autograd, float64); full
  # fine-tunes of GGUF bases saved as Hugging Face directories (test_hf_export.cpp; tokenizers.js
  # from npm installed into the build tree reads their tokenizers).
  mesh_add_test(models_finetune_tests
    SOURCES test_finetune.cpp test_hf_export.cpp
    LIBS mesh_inference nlohmann_json::nlohmann_json)
  target_compile_definitions(models_finetune_tests PRIVATE MESH_MODELS_TEST_DIR="${CMAKE_CURRENT_SOURCE_DIR}"
                                                         MESH_MODELS_NPM_DIR="${CMAKE_CURRENT_BINARY_DIR}/npm")
  # Pipeline stages: the planner's splits, chains of stage sessions and the pipeline that drives
  # them against the whole model.
  mesh_add_test(models_stage_tests
    SOURCES test_stage_plan.cpp test_stages.cpp test_pipeline.cpp
    LIBS mesh_inference)
endif()
