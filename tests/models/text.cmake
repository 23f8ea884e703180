# Tests of mesh_text: against independent references in Python (tests/models/ref_*.py: a byte-level
# BPE written from GPT-2's algorithm, sentencepiece itself, jinja2 on the real templates); each
# case warns and passes when python3 or a module is missing.
find_package(nlohmann_json REQUIRED)
mesh_add_test(text_tests
  SOURCES test_tokenizer_json.cpp test_tokenizer_bpe.cpp test_tokenizer_spm.cpp test_tokenizer_stream.cpp
          test_chat_template.cpp test_text_dataset.cpp test_text_shard.cpp
  LIBS mesh_text nlohmann_json::nlohmann_json)
target_compile_definitions(text_tests PRIVATE MESH_TEXT_TEST_DIR="${CMAKE_CURRENT_SOURCE_DIR}")
