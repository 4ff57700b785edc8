//! The build links libtorch: a tensor is created and multiplied.

#[test]
fn matmul_runs_through_libtorch() {
    let a = tch::Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0]).reshape([2, 2]);
    let b = tch::Tensor::from_slice(&[5.0f32, 6.0, 7.0, 8.0]).reshape([2, 2]);
    let c = a.matmul(&b);
    let got: Vec<f32> = Vec::try_from(c.flatten(0, 1)).unwrap();
    assert_eq!(got, vec![19.0, 22.0, 43.0, 50.0]);
}
