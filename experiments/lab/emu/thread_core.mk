# What the Makefiles of the thread-core emulators (allreduce/, ep/) share. Each sets
# FAMILY (its kernels: kernels/$(FAMILY)/*.cu) and CALLS (make run's calls a rank),
# includes this, then gives its `all` (the default goal) and its test binaries.
ROOT := ../../../..
BUILD ?= /tmp/distlab_$(FAMILY)_emu
N ?= 2
SEED ?= 1
.DEFAULT_GOAL := all
KERNELS := $(wildcard $(ROOT)/kernels/$(FAMILY)/*.cu)
INC := -I$(ROOT)/kernels -I$(ROOT)/core -I$(ROOT)/core/include
# a test binary of emu_test.cpp and the kernel files (as C++), the family's part force-included;
# its recipe ends: -o $@ emu_test.cpp $(EMU_KERNELS) [objects]
EMU_CXX := g++ -std=c++20 -O1 -g -pthread -Wall -Wno-unused-function -include cuda_emu.h $(INC)
EMU_KERNELS := -x c++ $(KERNELS) -x none
HEADERS := $(wildcard $(ROOT)/kernels/$(FAMILY)/*.h $(ROOT)/kernels/$(FAMILY)/*.cuh $(ROOT)/kernels/common/*.h \
  $(ROOT)/kernels/common/*.cuh)
EMU_DEPS := emu_test.cpp cuda_emu.h ../thread_core.h $(KERNELS) $(HEADERS)

.PHONY: all run ptxas
run: $(BUILD)/emu_test
	$(BUILD)/emu_test $(N) $(CALLS) $(SEED)

# registers and spills of every instantiation for sm_90
ptxas:
	@mkdir -p $(BUILD)
	for f in $(KERNELS); do \
	  nvcc -std=c++20 -O3 -gencode arch=compute_90,code=sm_90 $(INC) \
	    -DDL_WITH_CUDA -Xptxas -v -c $$f -o $(BUILD)/$$(basename $$f .cu).o 2>&1 | \
	    grep -E "Compiling|registers|spill|error|warning"; \
	done
