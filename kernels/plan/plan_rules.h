// The planners' shape rules as one table: each rule that overrides or bounds a cost model
// for a class of products, with the class it covers, what it decides, the gain measured and
// where the results are. docs/architecture.md ("Planner rules") lists this table, and
// tests/test_plan.py checks that the list matches it and that each rule's class gets its
// decision and a product just outside does not. Plain C++, no CUDA.
#pragma once

#include <cstddef>

#include "gemmt/gemm_args.h"

namespace gemmt {

struct PlanRule {
  const char* name;         // the predicate's name in the planner
  const char* planner;      // "sm90" (kernels/plan/sm90_plan.cpp) or "simt" (simt_plan.cpp)
  const char* applied_in;   // the planner function that applies it
  const char* shape_class;  // the products it covers
  const char* decision;     // what it decides for them
  const char* reason;       // why, in a sentence
  const char* gain;         // measured gain ("to be measured" where none yet)
  const char* results;      // results folder and the commit that added it, or the source
  const char* device;       // the device properties its class reads
  bool measured;            // false: reasoned, to be measured
  // Whether a product (as the caller gives it) is in the rule's class.
  bool (*in_class)(const GemmArgs& args);
  // What the tuner's measured winners said where the rule decides the default plan: its
  // class ((a) decides none of them, (b) kept, (c) contradicted everywhere: to be retired,
  // (d) mixed) and the counts per results folder, as tests/tune_evidence.py computes them
  // (tests/test_plan.py checks the two agree), then a remark.
  const char* tuner;
};

// The table, in the order docs/architecture.md lists it.
const PlanRule* plan_rules(std::size_t* count);

// The rule of that name, or nullptr.
const PlanRule* find_plan_rule(const char* name);

}  // namespace gemmt
