//! Rule M1: random operation sequences checked against a reference model.
